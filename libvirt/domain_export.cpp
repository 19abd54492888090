// export_domain_xml: built as a libxml2 tree (so every path and command line is escaped) and written indented.
#include "libvirt/domain_export.h"

#include <libxml/tree.h>

#include <filesystem>

#include <fmt/format.h>

#include "logging/trace_format.h"
#include "vmm/user_network.h"

namespace deja {
namespace {

const xmlChar* x(const char* s) { return reinterpret_cast<const xmlChar*>(s); }

xmlNode* add(xmlNode* parent, const char* name, const std::string& content = {}) {
  return xmlNewTextChild(parent, nullptr, x(name), content.empty() ? nullptr : x(content.c_str()));
}
void set(xmlNode* n, const char* name, const std::string& value) { xmlNewProp(n, x(name), x(value.c_str())); }

// libvirt's UUID text from 16 bytes (marked as an RFC 4122 version 8 UUID: derived, not random).
std::string uuid_text(std::array<uint8_t, 32> bytes) {
  bytes[6] = uint8_t((bytes[6] & 0x0f) | 0x80);
  bytes[8] = uint8_t((bytes[8] & 0x3f) | 0x80);
  const std::string h = hex(std::span(bytes.data(), 16));
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

std::string mac_text(const std::string& mac) {
  std::string out;
  for (unsigned char c : mac) out += fmt::format("{}{:02x}", out.empty() ? "" : ":", c);
  return out;
}

const trace::InputFile* input(const trace::Header& h, const std::string& role) {
  for (const auto& f : h.inputs())
    if (f.role() == role) return &f;
  return nullptr;
}

}  // namespace

std::string export_domain_xml(const trace::Header& h, const std::string& trace_path) {
  const trace::MachineConfig& c = h.config();
  xmlDoc* doc = xmlNewDoc(x("1.0"));
  xmlNode* domain = xmlNewNode(nullptr, x("domain"));
  xmlDocSetRootElement(doc, domain);
  // QEMU's emulation where the recording ran the software CPU, KVM where it ran on KVM.
  set(domain, "type", c.backend() == "kvm" ? "kvm" : "qemu");

  const std::string serialized = h.SerializeAsString();
  const auto header_sha = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size()));
  const bool from_libvirt = h.has_libvirt_domain();
  add(domain, "name", from_libvirt && !h.libvirt_domain().name().empty()
                          ? h.libvirt_domain().name()
                          : "deja-" + std::filesystem::path(trace_path).stem().string());
  add(domain, "uuid", from_libvirt && !h.libvirt_domain().uuid().empty() ? h.libvirt_domain().uuid() : uuid_text(header_sha));
  add(domain, "description", fmt::format("The machine deja recorded in {}", trace_path));

  xmlNode* metadata = add(domain, "metadata");
  xmlNode* rec = xmlNewChild(metadata, nullptr, x("recording"), nullptr);
  xmlNs* ns = xmlNewNs(rec, x(kDejaMetadataNamespace), x("deja"));
  xmlSetNs(rec, ns);
  set(rec, "trace", trace_path);
  set(rec, "format", std::to_string(h.format_version()));
  set(rec, "deja", h.deja_version() + " " + h.build_id());
  set(rec, "backend", c.backend());
  set(rec, "cpu", h.cpu_model().empty() ? "deja-v1" : h.cpu_model());
  set(rec, "progress", c.progress_mode());
  set(rec, "machine", c.machine().empty() ? "pc" : c.machine());
  for (const auto& f : h.inputs()) {
    xmlNode* in = xmlNewChild(rec, ns, x("input"), nullptr);
    set(in, "role", f.role());
    set(in, "path", f.path());
    set(in, "sha256", hex(f.sha256()));
  }
  for (const auto& args : c.module_args()) xmlNewTextChild(rec, ns, x("module-args"), x(args.c_str()));

  xmlNode* memory = add(domain, "memory", std::to_string(c.memory_bytes() >> 10));
  set(memory, "unit", "KiB");
  xmlNode* current = add(domain, "currentMemory", std::to_string(c.memory_bytes() >> 10));
  set(current, "unit", "KiB");
  add(domain, "vcpu", std::to_string(c.vcpus() ? c.vcpus() : 1));

  xmlNode* os = add(domain, "os");
  xmlNode* type = add(os, "type", "hvm");
  set(type, "arch", "x86_64");
  set(type, "machine", "pc");
  const trace::InputFile* kernel = input(h, "kernel");
  if (!kernel) kernel = input(h, "image");  // a Multiboot or ELF image: QEMU's -kernel boots those too
  if (kernel) add(os, "kernel", kernel->path());
  if (const trace::InputFile* initrd = input(h, "initrd")) add(os, "initrd", initrd->path());
  if (!c.cmdline().empty()) add(os, "cmdline", c.cmdline());

  if (c.machine() == "pc-apic") add(add(domain, "features"), "apic");
  set(add(domain, "clock"), "offset", "utc");
  // A recording is one boot: it ends when the guest powers off, resets or stops.
  for (const char* event : {"on_poweroff", "on_reboot", "on_crash"}) add(domain, event, "destroy");

  xmlNode* devices = add(domain, "devices");
  for (int i = 0; i < c.disks_size(); ++i) {
    const auto& d = c.disks(i);
    xmlNode* disk = add(devices, "disk");
    set(disk, "type", "file");
    set(disk, "device", "disk");
    xmlNode* driver = add(disk, "driver");
    set(driver, "name", "qemu");
    set(driver, "type", "raw");
    set(add(disk, "source"), "file", d.path());
    xmlNode* target = add(disk, "target");
    set(target, "dev", std::string("vd") + char('a' + i % 26));
    set(target, "bus", "virtio");
    // deja never wrote the image: the guest's writes went to an overlay.
    add(disk, d.read_only() ? "readonly" : "transient");
  }
  for (int i = 0; i < c.nets_size(); ++i) {
    const auto& n = c.nets(i);
    xmlNode* nic = add(devices, "interface");
    set(nic, "type", "user");
    if (n.mac().size() == 6) set(add(nic, "mac"), "address", mac_text(n.mac()));
    std::string spec = "user";
    for (const auto& f : n.host_forwards()) spec += ",hostfwd=" + f;
    if (auto parsed = parse_net_option(spec)) {
      for (const HostForward& f : parsed->forwards) {
        xmlNode* forward = add(nic, "portForward");
        set(forward, "proto", f.udp ? "udp" : "tcp");
        if (!f.host_addr.empty()) set(forward, "address", f.host_addr);
        xmlNode* range = add(forward, "range");
        set(range, "start", std::to_string(f.host_port));
        set(range, "to", std::to_string(f.guest_port));
      }
    }
    set(add(nic, "model"), "type", "virtio");
  }
  xmlNode* serial = add(devices, "serial");
  set(serial, "type", "pty");
  set(add(serial, "target"), "port", "0");
  xmlNode* console = add(devices, "console");
  set(console, "type", "pty");
  xmlNode* console_target = add(console, "target");
  set(console_target, "type", "serial");
  set(console_target, "port", "0");
  if (c.rng()) {
    xmlNode* rng = add(devices, "rng");
    set(rng, "model", "virtio");
    set(add(rng, "backend", "/dev/urandom"), "model", "random");
  }
  // What deja's machine does not have, said so that libvirt adds none of it.
  xmlNode* usb = add(devices, "controller");
  set(usb, "type", "usb");
  set(usb, "model", "none");
  set(add(devices, "memballoon"), "model", "none");

  xmlChar* text = nullptr;
  int size = 0;
  xmlDocDumpFormatMemoryEnc(doc, &text, &size, "UTF-8", 1);
  std::string out(reinterpret_cast<const char*>(text), size_t(size));
  xmlFree(text);
  xmlFreeDoc(doc);
  return out;
}

}  // namespace deja
