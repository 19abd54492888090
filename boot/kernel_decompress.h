// Decompressing a bzImage's payload (the compressed vmlinux) in-process with Debian's libraries, for a PVH boot.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deja {

// The compressions Linux's arch/x86/boot/compressed may use (CONFIG_KERNEL_*), told apart by their magic.
enum class KernelCompression { kUnknown, kGzip, kBzip2, kLzma, kXz, kLzo, kLz4, kZstd };
std::string_view compression_name(KernelCompression c);  // "gzip", "xz", ...

KernelCompression detect_compression(std::span<const uint8_t> payload);

// Decompresses a bzImage payload. Linux appends the decompressed size as 4 little-endian bytes to every
// compressed kernel (gzip's own trailer ends the same way); the output must have exactly that size, which must
// not exceed `max_output`. A truncated or corrupt stream, an unknown compression and a size mismatch are errors
// (kBadImage) naming `name`.
Result<std::vector<uint8_t>> decompress_kernel_payload(std::span<const uint8_t> payload, const std::string& name,
                                                       uint64_t max_output);

}  // namespace deja
