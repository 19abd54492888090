// Reading an ELF's symbol table or a System.map, bounds-checked, for naming code addresses.
#include "explore/symbols.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace deja::explore {

namespace {
constexpr uint64_t kMaxFile = 512ull << 20;

template <typename T>
bool read_at(const std::vector<uint8_t>& file, uint64_t offset, T& out) {
  if (offset > file.size() || sizeof(T) > file.size() - offset) return false;
  std::memcpy(&out, file.data() + offset, sizeof(T));
  return true;
}

// Elf32 or Elf64, as the types say.
template <typename Ehdr, typename Shdr, typename Sym, unsigned char (*kType)(unsigned char)>
Result<> elf_symbols(const std::vector<uint8_t>& file, const std::string& path, std::map<uint64_t, std::string>& out) {
  Ehdr eh;
  if (!read_at(file, 0, eh) || eh.e_shentsize != sizeof(Shdr)) return fail(ErrorKind::kInvalidArgument, "{}: a damaged ELF header", path);
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Shdr sh;
    if (!read_at(file, eh.e_shoff + uint64_t(i) * sizeof(Shdr), sh)) break;
    if (sh.sh_type != SHT_SYMTAB || sh.sh_entsize != sizeof(Sym)) continue;
    Shdr strings;
    if (!read_at(file, eh.e_shoff + uint64_t(sh.sh_link) * sizeof(Shdr), strings)) continue;
    for (uint64_t at = 0; at + sizeof(Sym) <= sh.sh_size; at += sizeof(Sym)) {
      Sym sym;
      if (!read_at(file, sh.sh_offset + at, sym)) break;
      const unsigned type = kType(sym.st_info);
      if ((type != STT_FUNC && type != STT_OBJECT && type != STT_NOTYPE) || sym.st_value == 0 || sym.st_name == 0) continue;
      const uint64_t name_at = uint64_t(strings.sh_offset) + sym.st_name;
      if (name_at >= file.size()) continue;
      const char* name = reinterpret_cast<const char*>(file.data() + name_at);
      const size_t length = strnlen(name, file.size() - name_at);
      if (length == 0 || length == file.size() - name_at) continue;
      out.emplace(sym.st_value, std::string(name, length));
    }
  }
  return {};
}

unsigned char elf32_type(unsigned char info) { return ELF32_ST_TYPE(info); }
unsigned char elf64_type(unsigned char info) { return ELF64_ST_TYPE(info); }
}  // namespace

Result<Symbols> Symbols::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorKind::kInvalidArgument, "--symbols {}: cannot read it", path);
  std::vector<uint8_t> file;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    file.insert(file.end(), buf, buf + in.gcount());
    if (file.size() > kMaxFile) return fail(ErrorKind::kInvalidArgument, "--symbols {}: larger than 512 MiB", path);
  }
  Symbols s;
  if (file.size() >= EI_NIDENT && std::memcmp(file.data(), ELFMAG, SELFMAG) == 0) {
    auto r = file[EI_CLASS] == ELFCLASS64 ? elf_symbols<Elf64_Ehdr, Elf64_Shdr, Elf64_Sym, elf64_type>(file, path, s.by_address_)
                                          : elf_symbols<Elf32_Ehdr, Elf32_Shdr, Elf32_Sym, elf32_type>(file, path, s.by_address_);
    if (!r) return std::unexpected(r.error());
  } else {
    std::istringstream lines(std::string(file.begin(), file.end()));
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string address, type, name;
      if (!(fields >> address >> type >> name) || type.size() != 1) continue;
      char* end = nullptr;
      const uint64_t value = std::strtoull(address.c_str(), &end, 16);
      if (*end == 0 && value != 0) s.by_address_.emplace(value, name);
    }
  }
  if (s.by_address_.empty()) return fail(ErrorKind::kInvalidArgument, "--symbols {}: no symbols in it", path);
  return s;
}

std::string Symbols::describe(uint64_t address) const {
  auto it = by_address_.upper_bound(address);
  if (it == by_address_.begin()) return {};
  --it;
  return address == it->first ? it->second : fmt::format("{}+{:#x}", it->second, address - it->first);
}

}  // namespace deja::explore
