#include "cli/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace kvgen {

namespace {
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

// Temporaries being written: a path in a fixed buffer per slot, live while its flag is set (a handler may only call
// async-signal-safe functions: it reads the buffers and unlinks).
constexpr int kSlots = 8;
constexpr size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
std::atomic<bool> g_live[kSlots];

void remove_temporaries() {
    for (int i = 0; i < kSlots; ++i)
        if (g_live[i].load()) ::unlink(g_paths[i]);
}

// The signal's default action, the temporaries removed first.
void terminate_now(int sig) {
    remove_temporaries();
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // delivered when the handler returns
}

extern "C" void on_terminate(int sig) { terminate_now(sig); }

extern "C" void on_sigint(int sig) {
    if (g_interrupted.exchange(true)) terminate_now(sig);  // the second Ctrl-C: end now
}

// Installs handler for sig, unless the process started with sig ignored (nohup, a background job of a script):
// that stays as it was.
void handle(int sig, void (*handler)(int)) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) return;
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
}
}  // namespace

void install_cleanup_handlers() {
    for (int sig : {SIGTERM, SIGHUP, SIGINT}) handle(sig, on_terminate);
}

void install_signal_handlers() {
    handle(SIGINT, on_sigint);
    std::signal(SIGPIPE, SIG_IGN);
}

bool interrupted() { return g_interrupted.load(); }

void clear_interrupt() { g_interrupted.store(false); }

int register_temporary(const std::string& path) {
    if (path.size() >= kPathMax) return -1;
    for (int i = 0; i < kSlots; ++i) {
        if (g_live[i].load()) continue;
        std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
        g_live[i].store(true);
        return i;
    }
    return -1;
}

void unregister_temporary(int slot) {
    if (slot >= 0) g_live[slot].store(false);
}

}  // namespace kvgen
