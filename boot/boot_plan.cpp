// Shared loader mechanics: piece validation (in RAM, clear of reserved areas and of each other), writing, paging.
#include "boot/boot_plan.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace deja {

Result<> check_pieces(const std::string& name, const std::vector<Piece>& pieces, uint64_t ram_size, bool below_4g,
                      std::span<const Region> reserved) {
  for (const Piece& piece : pieces) {
    if (piece.gpa > ram_size || piece.mem_size > ram_size - piece.gpa) {
      return fail(ErrorKind::kBadImage,
                  "{}: {} at guest-physical [{:#x}, +{:#x}) lies outside RAM (RAM size {:#x}; give the guest more "
                  "memory or link the image lower)",
                  name, piece.what, piece.gpa, piece.mem_size, ram_size);
    }
    if (below_4g && piece.end() > kBoot4GiB) {
      return fail(ErrorKind::kBadImage, "{}: {} at [{:#x}, {:#x}) ends above 4 GiB, unreachable from a 32-bit entry",
                  name, piece.what, piece.gpa, piece.end());
    }
    for (const Region& region : reserved) {
      if (ranges_overlap(piece.gpa, piece.end(), region.start, region.end)) {
        return fail(ErrorKind::kBadImage,
                    "{}: {} at [{:#x}, {:#x}) overlaps {} at [{:#x}, {:#x}) (see docs/boot.md for the boot memory "
                    "layout)",
                    name, piece.what, piece.gpa, piece.end(), region.what, region.start, region.end);
      }
    }
  }
  // Sweep in address order (an image may carry 65535 program headers: no quadratic pairing).
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pieces[a].gpa < pieces[b].gpa; });
  std::optional<size_t> furthest;  // the piece reaching highest among those seen so far
  for (size_t i : order) {
    if (pieces[i].mem_size == 0) continue;
    if (furthest && pieces[i].gpa < pieces[*furthest].end()) {
      const Piece& later = pieces[std::max(i, *furthest)];
      const Piece& earlier = pieces[std::min(i, *furthest)];
      return fail(ErrorKind::kBadImage, "{}: {} at [{:#x}, {:#x}) overlaps {} at [{:#x}, {:#x})", name, later.what,
                  later.gpa, later.end(), earlier.what, earlier.gpa, earlier.end());
    }
    if (!furthest || pieces[i].end() > pieces[*furthest].end()) furthest = i;
  }
  return {};
}

Result<> write_piece(GuestMemory& memory, const Piece& piece) {
  if (auto r = memory.write(Gpa{piece.gpa}, piece.data); !r) return r;
  static const std::vector<uint8_t> kZeros(64 * 1024, 0);
  for (uint64_t at = piece.data.size(); at < piece.mem_size;) {
    const uint64_t chunk = std::min<uint64_t>(kZeros.size(), piece.mem_size - at);
    if (auto r = memory.write(Gpa{piece.gpa + at}, std::span(kZeros.data(), chunk)); !r) return r;
    at += chunk;
  }
  return {};
}

Result<> write_pieces(GuestMemory& memory, std::span<const std::vector<Piece>* const> groups, LoadedImage& loaded) {
  for (const auto* group : groups) {
    for (const Piece& piece : *group) {
      if (auto r = write_piece(memory, piece); !r) return r;
      loaded.loaded_ranges.emplace_back(piece.gpa, piece.mem_size);
    }
  }
  return {};
}

namespace {
constexpr uint64_t k1GiB = uint64_t{1} << 30;
constexpr uint64_t k2MiB = uint64_t{1} << 21;
uint64_t mapped_bytes(uint64_t ram_size) { return std::max(kBoot4GiB, align_up(ram_size, k1GiB)); }
}  // namespace

uint64_t identity_page_tables_size(uint64_t ram_size) { return (2 + mapped_bytes(ram_size) / k1GiB) * kPageSize; }

std::vector<uint8_t> build_identity_page_tables(uint64_t base, uint64_t ram_size) {
  constexpr uint64_t kPresent = 1, kWritable = 2, kPwt = 1 << 3, kPcd = 1 << 4, kLargePage = 1 << 7;
  const uint64_t directories = mapped_bytes(ram_size) / k1GiB;
  std::vector<uint64_t> table((2 + directories) * 512, 0);
  const uint64_t pdpt = base + kPageSize;
  table[0] = pdpt | kPresent | kWritable;
  for (uint64_t d = 0; d < directories; ++d) {
    table[512 + d] = (base + (2 + d) * kPageSize) | kPresent | kWritable;
    for (uint64_t e = 0; e < 512; ++e) {
      const uint64_t address = d * k1GiB + e * k2MiB;
      uint64_t entry = address | kPresent | kWritable | kLargePage;
      if (address >= ram_size) entry |= kPcd | kPwt;
      table[(2 + d) * 512 + e] = entry;
    }
  }
  std::vector<uint8_t> bytes(table.size() * 8);
  std::memcpy(bytes.data(), table.data(), bytes.size());
  return bytes;
}

SegmentReg flat_segment(uint16_t selector, uint8_t type, bool code64) {
  SegmentReg s;
  s.base = 0;
  s.limit = 0xffffffff;
  s.selector = selector;
  s.type = type;
  s.present = true;
  s.s = true;
  s.db = !code64;
  s.l = code64;
  s.g = true;
  return s;
}

void reset_fpu_state(CpuState& st) {
  const uint16_t fcw = 0x037f;
  const uint32_t mxcsr = 0x1f80, mxcsr_mask = 0xffff;
  std::memcpy(st.fxsave.data() + 0, &fcw, sizeof(fcw));
  std::memcpy(st.fxsave.data() + 24, &mxcsr, sizeof(mxcsr));
  std::memcpy(st.fxsave.data() + 28, &mxcsr_mask, sizeof(mxcsr_mask));
}

void put_le(std::vector<uint8_t>& out, uint64_t offset, uint64_t value, unsigned width) {
  for (unsigned i = 0; i < width; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t get_le(std::span<const uint8_t> bytes, uint64_t offset, unsigned width) {
  uint64_t value = 0;
  for (unsigned i = 0; i < width; ++i) value |= uint64_t{bytes[offset + i]} << (8 * i);
  return value;
}

}  // namespace deja
