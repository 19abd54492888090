// trace_forge: rewrites a genuine trace into a hostile one (tests only): other inputs in the header, huge serial events.
//
//   trace_forge IN OUT [--image-path P] [--modules N PATH] [--serial-events K BYTES] [--cmdline-bytes HEX]
//                      [--end-field digest|instructions|guest-exits|status] [--digest-part rflags|ram|device]
//
// The result is a well-formed trace (checksums, hash chain, footer all valid): what an attacker who can
// write a trace file produces, so only deja's semantic checks stand between it and the host.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "logging/trace_reader.h"
#include "logging/trace_writer.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: trace_forge IN OUT [--image-path P] [--modules N PATH] [--serial-events K BYTES] "
               "[--cmdline-bytes HEX] [--end-field F] [--digest-part P]\n");
  return 2;
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deja;
  if (argc < 3) return usage();
  std::string in = argv[1], out = argv[2];
  std::string image_path;
  uint64_t modules = 0, serial_events = 0, serial_bytes = 0;
  std::string module_path;
  std::optional<std::string> cmdline;
  std::string end_field;
  std::string digest_part;  // the first state digest's: as if the recording had seen another value there
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--image-path" && i + 1 < argc) {
      image_path = argv[++i];
    } else if (a == "--modules" && i + 2 < argc) {
      modules = std::strtoull(argv[++i], nullptr, 10);
      module_path = argv[++i];
    } else if (a == "--serial-events" && i + 2 < argc) {
      serial_events = std::strtoull(argv[++i], nullptr, 10);
      serial_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--end-field" && i + 1 < argc) {
      end_field = argv[++i];
    } else if (a == "--digest-part" && i + 1 < argc) {
      digest_part = argv[++i];
    } else if (a == "--cmdline-bytes" && i + 1 < argc) {
      cmdline = unhex(argv[++i]);
    } else {
      return usage();
    }
  }
  auto reader = TraceReader::open(in);
  if (!reader) {
    std::fprintf(stderr, "trace_forge: %s\n", reader.error().message.c_str());
    return 1;
  }
  trace::Header header = (*reader)->header();
  if (!image_path.empty()) {
    for (auto& f : *header.mutable_inputs())
      if (f.role() == "image") f.set_path(image_path);
  }
  for (uint64_t i = 0; i < modules; ++i) {
    auto* f = header.add_inputs();
    f->set_role("module");
    f->set_path(module_path);
    f->set_sha256(std::string(32, '\x5a'));
    f->set_size(0);
    header.mutable_config()->add_module_args("");
  }
  if (cmdline) header.mutable_config()->set_cmdline(*cmdline);
  auto writer = TraceWriter::create(out, header);
  if (!writer) {
    std::fprintf(stderr, "trace_forge: %s\n", writer.error().message.c_str());
    return 1;
  }
  trace::Event flood;
  flood.mutable_serial_output()->set_data(std::string(serial_bytes, '\0'));
  for (uint64_t i = 0; i < serial_events; ++i) {
    if (auto r = (*writer)->append(flood); !r) {
      std::fprintf(stderr, "trace_forge: %s\n", r.error().message.c_str());
      return 1;
    }
  }
  trace::Footer footer;
  for (;;) {
    auto e = (*reader)->next();
    if (!e || !*e) break;
    if ((*e)->has_digest() && (*e)->digest().has_parts() && !digest_part.empty()) {
      trace::StateDigest* d = (*e)->mutable_digest();
      std::string bytes = d->digest();
      bytes[0] = char(bytes[0] ^ 1);
      d->set_digest(bytes);
      trace::DigestParts* parts = d->mutable_parts();
      if (digest_part == "rflags") {
        parts->set_registers(17, parts->registers(17) ^ 0x80);  // SF
      } else if (digest_part == "ram") {
        for (int i = 0; i < parts->ram_regions_size(); ++i) {
          if (parts->ram_regions(i) != 0) {
            parts->set_ram_regions(i, parts->ram_regions(i) ^ 1);
            break;
          }
        }
      } else if (digest_part == "device") {
        parts->set_devices(0, parts->devices(0) ^ 1);
      }
      digest_part.clear();
    }
    if ((*e)->has_end() && !end_field.empty()) {
      trace::End* end = (*e)->mutable_end();
      if (end_field == "digest") {
        std::string d = end->digest();
        if (!d.empty()) d[0] = char(d[0] ^ 1);
        end->set_digest(d);
      } else if (end_field == "instructions") {
        end->set_instructions(end->instructions() + 1);
      } else if (end_field == "guest-exits") {
        end->mutable_at()->set_guest_exits(end->at().guest_exits() + 1);
      } else if (end_field == "status") {
        end->set_exit_status(end->exit_status() + 2);
      }
    }
    if (auto r = (*writer)->append(**e); !r) {
      std::fprintf(stderr, "trace_forge: %s\n", r.error().message.c_str());
      return 1;
    }
  }
  if (const trace::Footer* f = (*reader)->footer()) footer = *f;
  if (auto r = (*writer)->finish(footer); !r) {
    std::fprintf(stderr, "trace_forge: %s\n", r.error().message.c_str());
    return 1;
  }
  return 0;
}
