#pragma once
// SIGINT stops generation at the next token (the run then reports and exits 130; a second SIGINT kills at once).
// SIGPIPE is ignored: a closed stdout is seen as a failed write, and generation ends quietly.

namespace kvgen {

void install_signal_handlers();
bool interrupted();  // a SIGINT has arrived
void clear_interrupt();  // forget it and arm the handler again (conversation mode: Ctrl-C stopped one answer)

}  // namespace kvgen
