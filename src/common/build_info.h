#pragma once
// What this binary is, for --version and the benchmark reports: kvgen's version ("0.1.0"), the commit it was built
// from ("a1b2c3d", or "a1b2c3d-dirty" when tracked files had changed since) and its build number (the commits in its
// history); "unknown" and 0 outside a git checkout.

namespace kvgen {

const char* version();
const char* build_commit();
int build_number();

}  // namespace kvgen
