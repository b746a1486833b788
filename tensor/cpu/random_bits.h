// The counter layout every Philox user shares (see tensor/ops_factory.cpp for the factories):
//   key     = (low 32 bits of seed, high 32 bits of seed)
//   counter = (low 32 of e, high 32 of e, stream, 0),  e = offset + element index
// Streams keep independent users apart, so dropout with seed s never reuses the bits randn(seed s)
// drew: 0 = factories (rand, randn), 1 = elementwise dropout (ag::dropout).
#pragma once
#include <cstdint>

#include "tensor/philox.h"

namespace qkv::cpu {

enum class RandomStream : uint32_t { factories = 0, dropout = 1 };

QKV_HD Philox4 random_bits(uint64_t seed, uint64_t e, RandomStream stream) {
  return philox4x32_10(static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(stream), 0u,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Inverted dropout's keep decision for element e: keep with probability 1 - p, from 24 bits.
QKV_HD bool dropout_keep(uint64_t seed, uint64_t e, float p) {
  return uniform_from_bits(random_bits(seed, e, RandomStream::dropout).v[0]) >= p;
}

}  // namespace qkv::cpu
