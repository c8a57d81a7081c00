// A case that fails on purpose, hidden ([.]: never run unless named), for first_failure_test.sh: the name the test
// binaries write to KVGEN_TEST_FIRST_FAILURE (first_failure.h), and a spec that selects it alone.
#include <catch2/catch.hpp>

TEST_CASE("first_failure.h's fixture, which fails on purpose: a name with a comma, [brackets], \\ \"quotes\" and *",
          "[.][first-failure]") {
    CHECK(1 + 1 == 3);
}
