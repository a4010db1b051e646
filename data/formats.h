// On-disk constants of the token file formats we read and write, as Megatron-LM's
// indexed_dataset.py and llm.c's dataloader define them (docs/data.md).
// Megatron indexed dataset: PREFIX.bin (tokens back to back) + PREFIX.idx:
//   [0,9) magic "MMIDIDX\0\0" | [9,17) u64 version 1 | [17] u8 dtype code |
//   [18,26) u64 S sequences | [26,34) u64 D doc-index entries |
//   i32 lengths[S] | i64 byte offsets[S] | i64 doc index[D] (0 ... S); little-endian, unaligned.
// llm.c shard: 256 x i32 header (magic, version, token count), then the tokens.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace tr::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; a big-endian host would need byte swaps");

// Element type of a token file. The first eight values are Megatron's .idx dtype codes.
enum class TokenDType : uint8_t {
  u8 = 1,
  i8 = 2,
  i16 = 3,
  i32 = 4,
  i64 = 5,
  f64 = 6,
  f32 = 7,
  u16 = 8,
  u32 = 100,  // llm.c v7 shards only; never written to a .idx
};

size_t token_dtype_size(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);

inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronVersion = 1;
inline constexpr size_t kMegatronHeaderBytes = 34;
// Megatron stores tokens as u16 when the vocabulary is smaller than this, else as i32.
inline constexpr int64_t kMegatronU16VocabLimit = 65500;

inline constexpr int32_t kLlmcMagicV1 = 20240520;  // version 1, uint16 tokens
inline constexpr int32_t kLlmcMagicV7 = 20240801;  // version 7, uint32 tokens
inline constexpr size_t kLlmcHeaderInts = 256;
inline constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

}  // namespace tr::data
