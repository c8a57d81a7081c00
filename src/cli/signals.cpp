#include "cli/signals.h"

#include <atomic>
#include <csignal>

namespace kvgen {

namespace {
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void on_sigint(int) { g_interrupted.store(true); }
}  // namespace

void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;  // the second Ctrl-C gets the default action: terminate now
    sigaction(SIGINT, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
}

bool interrupted() { return g_interrupted.load(); }

void clear_interrupt() {
    g_interrupted.store(false);
    install_signal_handlers();
}

}  // namespace kvgen
