#pragma once
// KVGEN_TEST_FIRST_FAILURE=FILE: FILE ends up holding the name of the first test case that failed, or of the one that
// was running when the process died (a crash, or a timeout's kill), and is empty when every case passed. Included by
// the test mains after <catch2/catch.hpp>. On a GPU, where a device fault is sticky and fails every case after the
// first faulting one, scripts/gpu-check.sh reruns that one case under compute-sanitizer to name the kernel and access.
#include <cstdlib>
#include <fstream>
#include <string>

namespace kvgen_test {

class FirstFailure : public Catch::TestEventListenerBase {
  public:
    using TestEventListenerBase::TestEventListenerBase;

    void testCaseStarting(const Catch::TestCaseInfo& info) override {
        if (!found_) write(info.name);  // there if the process dies inside this case
    }
    void testCaseEnded(const Catch::TestCaseStats& stats) override {
        if (found_) return;
        if (stats.totals.assertions.failed > 0)
            found_ = true;
        else
            write("");
    }

  private:
    static void write(const std::string& name) {
        const char* path = std::getenv("KVGEN_TEST_FIRST_FAILURE");
        if (path == nullptr || *path == '\0') return;
        std::ofstream f(path, std::ios::trunc);
        f << name << (name.empty() ? "" : "\n");
    }
    bool found_ = false;
};

}  // namespace kvgen_test

// note: the macro pastes its argument into a name, so it takes the class unqualified
using kvgen_test::FirstFailure;
CATCH_REGISTER_LISTENER(FirstFailure)
