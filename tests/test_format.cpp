#include <catch2/catch.hpp>

#include "cli/format.h"
#include "engine/kv_layout.h"
#include "model/config.h"

using namespace kvgen;

TEST_CASE("byte sizes print like the docs", "[format]") {
    CHECK(human_bytes(512) == "512 B");
    CHECK(human_bytes(800 * 1024) == "800 KiB");
    CHECK(human_bytes(3.125 * 1024 * 1024 * 1024) == "3.12 GiB");
    CHECK(human_bytes(22.5 * 1024) == "22.5 KiB");
}

TEST_CASE("KV cache cost of LLaMA-2 13B is 800 KiB per token at f16", "[format][kv]") {
    Config c;
    c.n_layers = 40;
    c.n_kv_heads = 40;
    c.head_dim = 128;
    const KvLayout kv = KvLayout::of(c, 4096, KvType::F16);
    CHECK(kv.bytes_per_token() == 800 * 1024);
    CHECK(kv.bytes() == size_t(800) * 1024 * 4096);
    CHECK(human_bytes(double(kv.bytes())) == "3.12 GiB");
    CHECK(KvLayout::of(c, 4096, KvType::F32).bytes() == 2 * kv.bytes());
}
