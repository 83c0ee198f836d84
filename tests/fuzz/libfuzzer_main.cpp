// libfuzzer_main.cpp: the differential fuzzer as a libFuzzer target (CPU backend; built by clang with
// -DDUALCAST_BUILD_FUZZERS=ON, see README.md). Every decision of a case (category, op, ranks, shapes,
// chains, kinds) is read from the input bytes, so coverage-guided mutation steers the structure; the
// values come from a generator seeded by the bytes. A failing case prints what it did and aborts, which
// is what libFuzzer records as a crash (the input that reproduces it is saved).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fuzz::Options opt = [] {
    fuzz::Options o;
    o.budget.max_numel = 1024;  // small cases: more of them per second
    o.large_chance = 0.0;
    const char* strict = std::getenv("DUALCAST_FUZZ_STRICT");
    o.strict = strict != nullptr && *strict == '1';
    return o;
  }();
  fuzz::Rng rng(data, size);
  const fuzz::Report rep = fuzz::run_case(rng, opt);
  if (rep.failures.empty()) return 0;
  std::fprintf(stderr, "dualcast fuzz: FAILED [%s] %s\n", fuzz::category_name(rep.category), rep.what.c_str());
  for (const auto& f : rep.failures) std::fprintf(stderr, "    %s\n", f.c_str());
  std::abort();
}
