// bzImage payload decompression: gzip (zlib), bzip2 (libbz2), LZMA and xz (liblzma), LZO (liblzo2, lzop framing),
// LZ4 (liblz4, the legacy frame `lz4 -l` writes) and zstd (libzstd), each into a buffer of the recorded size.
#include "boot/kernel_decompress.h"

#include <bzlib.h>
#include <lz4.h>
#include <lzma.h>
#include <lzo/lzo1x.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace deja {
namespace {

uint32_t le32(std::span<const uint8_t> b, uint64_t at) {
  return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8 | uint32_t{b[at + 2]} << 16 | uint32_t{b[at + 3]} << 24;
}
uint32_t be32(std::span<const uint8_t> b, uint64_t at) {
  return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | uint32_t{b[at + 3]};
}

bool starts_with(std::span<const uint8_t> b, std::initializer_list<uint8_t> magic) {
  return b.size() >= magic.size() && std::equal(magic.begin(), magic.end(), b.begin());
}

// Why a stream failed, for the message: the input ran out (a truncated payload) or the data is corrupt.
struct Failure {
  bool truncated = false;
  std::string detail;
};
using Decoded = std::expected<uint64_t, Failure>;  // bytes written into the output
Failure truncated(std::string detail = "the compressed stream ends early") { return {true, std::move(detail)}; }
Failure corrupt(std::string detail) { return {false, std::move(detail)}; }
// The stream would produce more than the size recorded in the trailer.
Failure overflow() { return {false, "it decompresses to more than its recorded size"}; }

// Payloads and their decompressed sizes are below 4 GiB (32-bit header fields), so one call sees everything.
Decoded inflate_gzip(std::span<const uint8_t> in, std::span<uint8_t> out) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return std::unexpected(corrupt("zlib could not start"));
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  const std::string message = z.msg ? z.msg : "corrupt gzip data";
  const uint64_t written = out.size() - z.avail_out;
  const bool output_full = z.avail_out == 0;
  inflateEnd(&z);
  if (rc == Z_STREAM_END) return written;
  if (rc == Z_BUF_ERROR) return std::unexpected(output_full ? overflow() : truncated());
  return std::unexpected(corrupt(message));
}

Decoded unbzip2(std::span<const uint8_t> in, std::span<uint8_t> out) {
  bz_stream s{};
  if (BZ2_bzDecompressInit(&s, 0, 0) != BZ_OK) return std::unexpected(corrupt("libbz2 could not start"));
  s.next_in = const_cast<char*>(reinterpret_cast<const char*>(in.data()));
  s.avail_in = static_cast<unsigned>(std::min<uint64_t>(in.size(), std::numeric_limits<unsigned>::max()));
  uint64_t written = 0;
  int rc = BZ_OK;
  while (rc == BZ_OK) {
    const uint64_t room = std::min<uint64_t>(out.size() - written, std::numeric_limits<unsigned>::max());
    s.next_out = reinterpret_cast<char*>(out.data() + written);
    s.avail_out = static_cast<unsigned>(room);
    rc = BZ2_bzDecompress(&s);
    written += room - s.avail_out;
    if (rc == BZ_OK && s.avail_in == 0 && s.avail_out != 0) {
      BZ2_bzDecompressEnd(&s);
      return std::unexpected(truncated());
    }
    if (rc == BZ_OK && written == out.size()) {
      BZ2_bzDecompressEnd(&s);
      return std::unexpected(overflow());
    }
  }
  BZ2_bzDecompressEnd(&s);
  if (rc == BZ_STREAM_END) return written;
  if (rc == BZ_UNEXPECTED_EOF) return std::unexpected(truncated());
  return std::unexpected(corrupt(fmt::format("libbz2 error {}", rc)));
}

Decoded unxz(std::span<const uint8_t> in, std::span<uint8_t> out, bool legacy_lzma) {
  lzma_stream s = LZMA_STREAM_INIT;
  // No memory limit beyond the dictionary the stream declares: the kernel's own is at most 64 MiB.
  const lzma_ret init = legacy_lzma ? lzma_alone_decoder(&s, UINT64_MAX) : lzma_stream_decoder(&s, UINT64_MAX, 0);
  if (init != LZMA_OK) return std::unexpected(corrupt("liblzma could not start"));
  s.next_in = in.data();
  s.avail_in = in.size();
  s.next_out = out.data();
  s.avail_out = out.size();
  lzma_ret rc = LZMA_OK;
  while (rc == LZMA_OK) rc = lzma_code(&s, LZMA_FINISH);
  const uint64_t written = out.size() - s.avail_out;
  const bool input_left = s.avail_in != 0;
  lzma_end(&s);
  if (rc == LZMA_STREAM_END) return written;
  if (rc == LZMA_BUF_ERROR) return std::unexpected(written == out.size() && input_left ? overflow() : truncated());
  switch (rc) {
    case LZMA_FORMAT_ERROR: return std::unexpected(corrupt("not an xz/lzma stream"));
    case LZMA_OPTIONS_ERROR: return std::unexpected(corrupt("unsupported xz/lzma options"));
    case LZMA_DATA_ERROR: return std::unexpected(corrupt("corrupt compressed data"));
    case LZMA_MEM_ERROR: return std::unexpected(corrupt("out of memory"));
    default: return std::unexpected(corrupt(fmt::format("liblzma error {}", int(rc))));
  }
}

Decoded unzstd(std::span<const uint8_t> in, std::span<uint8_t> out) {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  if (!ctx) return std::unexpected(corrupt("libzstd could not start"));
  // zstd -22 --ultra (the kernel's choice) uses windows above the default limit.
  ZSTD_DCtx_setParameter(ctx, ZSTD_d_windowLogMax, 31);  // ZSTD_WINDOWLOG_MAX_64
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  size_t rc = 1;
  while (rc != 0) {
    rc = ZSTD_decompressStream(ctx, &output, &input);
    if (ZSTD_isError(rc)) {
      std::string why = ZSTD_getErrorName(rc);
      ZSTD_freeDCtx(ctx);
      return std::unexpected(corrupt(why));
    }
    if (rc != 0 && output.pos == output.size) {
      ZSTD_freeDCtx(ctx);
      return std::unexpected(overflow());
    }
    if (rc != 0 && input.pos == input.size) {
      ZSTD_freeDCtx(ctx);
      return std::unexpected(truncated());
    }
  }
  ZSTD_freeDCtx(ctx);
  return output.pos;
}

// lz4 -l: magic 0x184C2102, then blocks of (32-bit compressed size, data), each at most 8 MiB decompressed.
Decoded unlz4_legacy(std::span<const uint8_t> in, std::span<uint8_t> out) {
  constexpr uint32_t kMagic = 0x184C2102;
  constexpr uint64_t kBlock = 8 << 20;
  uint64_t at = 4, written = 0;
  while (written < out.size()) {
    if (in.size() - at < 4) return std::unexpected(truncated());
    const uint32_t size = le32(in, at);
    at += 4;
    if (size == kMagic) continue;  // concatenated streams
    if (size > in.size() - at) return std::unexpected(truncated(fmt::format("an LZ4 block of {} bytes is cut off", size)));
    const uint64_t room = std::min(kBlock, out.size() - written);
    const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data() + at),
                                        reinterpret_cast<char*>(out.data() + written), static_cast<int>(size),
                                        static_cast<int>(room));
    if (got < 0) return std::unexpected(corrupt(fmt::format("corrupt LZ4 block at offset {:#x}", at - 4)));
    written += got;
    at += size;
  }
  return written;
}

// lzop framing (the kernel's `lzop -9`) around LZO1X blocks.
Decoded unlzo(std::span<const uint8_t> in, std::span<uint8_t> out) {
  constexpr uint32_t kAdler32D = 0x1, kAdler32C = 0x2, kExtraField = 0x40, kCrc32D = 0x100, kCrc32C = 0x200,
                     kFilter = 0x800;
  if (lzo_init() != LZO_E_OK) return std::unexpected(corrupt("liblzo2 could not start"));
  uint64_t at = 9;
  auto need = [&](uint64_t n) { return at <= in.size() && in.size() - at >= n; };
  if (!need(9)) return std::unexpected(truncated("the lzop header is cut off"));
  const uint32_t version = uint32_t{in[at]} << 8 | in[at + 1];
  at += 4;  // version, library version
  if (version >= 0x0940) at += 2;  // version needed to extract
  const uint8_t method = in[at++];
  if (method < 1 || method > 3) return std::unexpected(corrupt(fmt::format("lzop method {} is not LZO1X", method)));
  if (version >= 0x0940) ++at;  // level
  if (!need(4)) return std::unexpected(truncated("the lzop header is cut off"));
  const uint32_t flags = be32(in, at);
  at += 4;
  if (flags & kFilter) at += 4;
  at += 8;                         // mode, mtime low
  if (version >= 0x0940) at += 4;  // mtime high
  if (!need(1)) return std::unexpected(truncated("the lzop header is cut off"));
  at += 1 + in[at] + 4;  // file name, header checksum
  if (flags & kExtraField) {
    if (!need(4)) return std::unexpected(truncated("the lzop header is cut off"));
    at += 4 + be32(in, at) + 4;
  }
  uint64_t written = 0;
  for (;;) {
    if (!need(4)) return std::unexpected(truncated());
    const uint32_t dst_len = be32(in, at);
    at += 4;
    if (dst_len == 0) break;
    if (!need(4)) return std::unexpected(truncated());
    const uint32_t src_len = be32(in, at);
    at += 4;
    at += ((flags & kAdler32D) ? 4 : 0) + ((flags & kCrc32D) ? 4 : 0);
    if (src_len < dst_len) at += ((flags & kAdler32C) ? 4 : 0) + ((flags & kCrc32C) ? 4 : 0);
    if (at > in.size() || src_len > in.size() - at) {
      return std::unexpected(truncated(fmt::format("an LZO block of {} bytes is cut off", src_len)));
    }
    if (src_len == 0 || src_len > dst_len) {
      return std::unexpected(corrupt(fmt::format("an LZO block claims {} compressed bytes for {}", src_len, dst_len)));
    }
    if (dst_len > out.size() - written) return std::unexpected(overflow());
    if (src_len == dst_len) {
      std::memcpy(out.data() + written, in.data() + at, dst_len);
    } else {
      lzo_uint got = dst_len;
      if (lzo1x_decompress_safe(in.data() + at, src_len, out.data() + written, &got, nullptr) != LZO_E_OK ||
          got != dst_len) {
        return std::unexpected(corrupt(fmt::format("corrupt LZO block at offset {:#x}", at)));
      }
    }
    written += dst_len;
    at += src_len;
  }
  return written;
}

}  // namespace

std::string_view compression_name(KernelCompression c) {
  switch (c) {
    case KernelCompression::kGzip: return "gzip";
    case KernelCompression::kBzip2: return "bzip2";
    case KernelCompression::kLzma: return "lzma";
    case KernelCompression::kXz: return "xz";
    case KernelCompression::kLzo: return "lzo";
    case KernelCompression::kLz4: return "lz4";
    case KernelCompression::kZstd: return "zstd";
    case KernelCompression::kUnknown: break;
  }
  return "unknown";
}

KernelCompression detect_compression(std::span<const uint8_t> p) {
  if (starts_with(p, {0x1f, 0x8b})) return KernelCompression::kGzip;
  if (starts_with(p, {'B', 'Z', 'h'})) return KernelCompression::kBzip2;
  if (starts_with(p, {0xfd, '7', 'z', 'X', 'Z', 0x00})) return KernelCompression::kXz;
  if (starts_with(p, {0x89, 'L', 'Z', 'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a})) return KernelCompression::kLzo;
  if (starts_with(p, {0x02, 0x21, 0x4c, 0x18})) return KernelCompression::kLz4;
  if (starts_with(p, {0x28, 0xb5, 0x2f, 0xfd})) return KernelCompression::kZstd;
  if (starts_with(p, {0x5d, 0x00, 0x00})) return KernelCompression::kLzma;  // lc=3 lp=0 pb=2, as `lzma -9` writes
  return KernelCompression::kUnknown;
}

Result<std::vector<uint8_t>> decompress_kernel_payload(std::span<const uint8_t> payload, const std::string& name,
                                                       uint64_t max_output) {
  const KernelCompression kind = detect_compression(payload);
  if (kind == KernelCompression::kUnknown) {
    std::string magic;
    for (size_t i = 0; i < std::min<size_t>(payload.size(), 6); ++i) magic += fmt::format("{:02x} ", payload[i]);
    if (!magic.empty()) magic.pop_back();
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}': its payload starts with bytes [{}], the magic of no compression deja knows "
                "(gzip, bzip2, lzma, xz, lzo, lz4, zstd)",
                name, magic);
  }
  if (payload.size() < 8) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}' is truncated: its {} payload is only {} bytes", name,
                compression_name(kind), payload.size());
  }
  const uint64_t expected = le32(payload, payload.size() - 4);
  if (expected == 0 || expected > max_output) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}': its {} payload says it decompresses to {} bytes, {} (the guest's RAM limits it "
                "to {})",
                name, compression_name(kind), expected, expected == 0 ? "which is empty" : "more than fits",
                max_output);
  }
  std::vector<uint8_t> out(expected);
  const auto stream = payload.first(payload.size() - 4);  // the size trailer is not part of the stream
  Decoded got;
  switch (kind) {
    case KernelCompression::kGzip: got = inflate_gzip(payload, out); break;  // gzip's own trailer ends with the size
    case KernelCompression::kBzip2: got = unbzip2(stream, out); break;
    case KernelCompression::kLzma: got = unxz(stream, out, true); break;
    case KernelCompression::kXz: got = unxz(stream, out, false); break;
    case KernelCompression::kLzo: got = unlzo(stream, out); break;
    case KernelCompression::kLz4: got = unlz4_legacy(stream, out); break;
    case KernelCompression::kZstd: got = unzstd(stream, out); break;
    case KernelCompression::kUnknown: break;
  }
  if (!got) {
    if (got.error().truncated) {
      return fail(ErrorKind::kBadImage, "Linux kernel '{}' is truncated: its {} payload ({} bytes) is cut off: {}",
                  name, compression_name(kind), payload.size(), got.error().detail);
    }
    return fail(ErrorKind::kBadImage, "Linux kernel '{}': its {} payload is corrupt: {}", name, compression_name(kind),
                got.error().detail);
  }
  if (*got != expected) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' is truncated: its {} payload decompresses to {} bytes, not the {} its trailer "
                "records",
                name, compression_name(kind), *got, expected);
  }
  return out;
}

}  // namespace deja
