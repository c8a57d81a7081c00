#pragma once
// SIGINT stops generation at the next token (the run then reports and exits 130; a second SIGINT ends it at once).
// SIGPIPE is ignored: a closed stdout is seen as a failed write, and generation ends quietly. SIGTERM, SIGHUP and an
// uncaught SIGINT end the process as their default action does, after removing the temporaries of files being
// written (register_temporary), so that no half-written file is left beside its target. A signal the process
// started with ignored (nohup) stays ignored.
#include <string>

namespace kvgen {

void install_cleanup_handlers();  // SIGTERM, SIGHUP and SIGINT: remove the temporaries, then the default action
void install_signal_handlers();   // generation: SIGINT stops at the next token; SIGPIPE ignored
bool interrupted();               // a SIGINT has arrived
void clear_interrupt();           // forget it (conversation mode: Ctrl-C stopped one answer)

// A file a signal's cleanup removes until unregister_temporary(slot); returns the slot (-1: too many at once, the
// file is then not removed by a signal).
int register_temporary(const std::string& path);
void unregister_temporary(int slot);

}  // namespace kvgen
