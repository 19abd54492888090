// Domain XML -> DomainPlan: libxml2 parses and validates (libvirt's domain.rng), then a whitelist walk maps each element.
#include "libvirt/domain_import.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libxml/parser.h>
#include <libxml/relaxng.h>
#include <libxml/tree.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <optional>

#include "core/cpu_model.h"
#include "logging/trace_format.h"

namespace deja {
namespace {

constexpr size_t kMaxDomainXmlBytes = 4u << 20;

struct DocFree {
  void operator()(xmlDoc* d) const { xmlFreeDoc(d); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

// Collects libxml2's messages (its generic handler would print them to stderr).
struct Messages {
  std::vector<std::string> lines;
  static void structured(void* self, const xmlError* e) {
    auto* m = static_cast<Messages*>(self);
    if (m->lines.size() >= 20) return;
    std::string text = e->message ? e->message : "error";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    m->lines.push_back(e->line > 0 ? fmt::format("line {}: {}", e->line, text) : text);
  }
  std::string joined() const {
    std::string out;
    for (const auto& l : lines) out += "\n  " + l;
    return out;
  }
};

Result<Doc> parse(std::string_view xml, const std::string& source) {
  Messages messages;
  xmlParserCtxtPtr ctxt = xmlNewParserCtxt();
  if (!ctxt) return fail(ErrorKind::kHost, "libxml2 cannot allocate a parser");
  xmlSetStructuredErrorFunc(&messages, [](void* self, xmlErrorPtr e) { Messages::structured(self, e); });
  // No network, no entity substitution (nothing from outside the document).
  Doc doc(xmlCtxtReadMemory(ctxt, xml.data(), int(xml.size()), "domain.xml", nullptr, XML_PARSE_NONET));
  xmlSetStructuredErrorFunc(nullptr, nullptr);
  xmlFreeParserCtxt(ctxt);
  if (!doc) return fail(ErrorKind::kInvalidArgument, "{}: not well-formed XML:{}", source, messages.joined());
  return doc;
}

std::string attr(xmlNode* n, const char* name) {
  xmlChar* v = xmlGetProp(n, reinterpret_cast<const xmlChar*>(name));
  if (!v) return {};
  std::string s(reinterpret_cast<const char*>(v));
  xmlFree(v);
  return s;
}
bool has_attr(xmlNode* n, const char* name) { return xmlHasProp(n, reinterpret_cast<const xmlChar*>(name)); }
// " name='value'" for messages, or "" when the attribute is not there.
std::string attr_text(xmlNode* n, const char* name) {
  return has_attr(n, name) ? fmt::format(" {}='{}'", name, attr(n, name)) : std::string();
}

std::string text(xmlNode* n) {
  xmlChar* v = xmlNodeGetContent(n);
  if (!v) return {};
  std::string s(reinterpret_cast<const char*>(v));
  xmlFree(v);
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string name_of(xmlNode* n) { return reinterpret_cast<const char*>(n->name); }

std::vector<xmlNode*> elements(xmlNode* parent) {
  std::vector<xmlNode*> out;
  for (xmlNode* c = parent ? parent->children : nullptr; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE) out.push_back(c);
  return out;
}

xmlNode* child(xmlNode* parent, const char* name) {
  for (xmlNode* c : elements(parent))
    if (name_of(c) == name) return c;
  return nullptr;
}

std::optional<uint64_t> number(const std::string& s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// libvirt's scaledInteger: a number and a unit (default KiB), as <memory unit='MiB'>.
std::optional<uint64_t> scaled_bytes(xmlNode* n) {
  auto v = number(text(n));
  if (!v) return std::nullopt;
  std::string unit = attr(n, "unit");
  struct Unit {
    const char* name;
    uint64_t bytes;
  };
  static constexpr Unit kUnits[] = {{"b", 1}, {"bytes", 1}, {"KB", 1000}, {"k", 1024}, {"KiB", 1024},
                                    {"MB", 1000'000}, {"M", 1 << 20}, {"MiB", 1 << 20}, {"GB", 1000'000'000},
                                    {"G", 1 << 30}, {"GiB", 1 << 30}, {"TB", 1000'000'000'000}, {"T", 1ull << 40},
                                    {"TiB", 1ull << 40}};
  if (unit.empty()) unit = "KiB";
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      if (*v > UINT64_MAX / u.bytes) return std::nullopt;
      return *v * u.bytes;
    }
  }
  return std::nullopt;
}

// The walk: whatever an element asks for is mapped into the plan, noted as having no meaning here, or refused.
class Mapper {
 public:
  explicit Mapper(DomainPlan& plan) : plan_(plan) {}

  void domain(xmlNode* d) {
    const std::string type = attr(d, "type");
    if (type != "kvm" && type != "qemu" && type != "test")
      refuse("<domain type='{}'>: deja runs full x86-64 machines, as libvirt's kvm and qemu drivers do", type);
    for (xmlNode* e : elements(d)) {
      const std::string n = name_of(e);
      if (n == "name") plan_.name = text(e);
      else if (n == "uuid") plan_.uuid = text(e);
      else if (n == "title" || n == "description" || n == "metadata") continue;  // information for people
      else if (n == "memory") memory(e);
      else if (n == "currentMemory") current_memory_ = scaled_bytes(e);
      else if (n == "vcpu") vcpu(e);
      else if (n == "os") os(e);
      else if (n == "features") features(e);
      else if (n == "cpu") cpu(e);
      else if (n == "clock") clock(e);
      else if (n == "on_poweroff" || n == "on_reboot" || n == "on_crash" || n == "on_lockfailure") lifecycle(n, text(e));
      else if (n == "pm") pm(e);
      else if (n == "devices") devices(e);
      else if (n == "seclabel" || n == "resource" || n == "cputune" || n == "numatune" || n == "memtune" ||
               n == "blkiotune" || n == "iothreads" || n == "iothreadids" || n == "memoryBacking" || n == "perf")
        host_side("<" + n + ">");
      else if (n == "maxMemory") refuse("<maxMemory>: memory hotplug; deja's RAM is fixed at <memory>");
      else if (n == "sysinfo") refuse("<sysinfo>: deja's machine has no SMBIOS tables to carry it");
      else refuse("<{}>: not something deja's machine has", n);
    }
    if (!plan_.memory_bytes) refuse("no <memory>");
    if (current_memory_ && plan_.memory_bytes && *current_memory_ < plan_.memory_bytes) {
      refuse("<currentMemory> {} KiB below <memory> {} KiB: that needs a memory balloon, which deja has not; make them "
             "equal", *current_memory_ >> 10, plan_.memory_bytes >> 10);
    }
    if (boot_order_ && !plan_.kernel.empty())
      plan_.notes.push_back("<boot>: a boot order is for firmware; with <kernel> the kernel boots (as QEMU does)");
    if (host_side_.size()) {
      std::string list;
      for (const auto& h : host_side_) list += (list.empty() ? "" : ", ") + h;
      plan_.notes.push_back("host-side settings with no meaning for deja's machine, not applied: " + list);
    }
  }

  std::vector<std::string> refused;

 private:
  template <typename... Args>
  void refuse(fmt::format_string<Args...> f, Args&&... args) {
    refused.push_back(fmt::format(f, std::forward<Args>(args)...));
  }
  void host_side(const std::string& what) { host_side_.push_back(what); }

  void memory(xmlNode* e) {
    auto bytes = scaled_bytes(e);
    if (!bytes || *bytes == 0) return refuse("<memory>{}</memory> unit '{}': not a size", text(e), attr(e, "unit"));
    if (*bytes % 4096) return refuse("<memory> {} bytes: not a multiple of 4 KiB", *bytes);
    plan_.memory_bytes = *bytes;
  }

  void vcpu(xmlNode* e) {
    auto n = number(text(e));
    if (!n || *n == 0 || *n > 4096) return refuse("<vcpu>{}</vcpu>: not a vCPU count", text(e));
    if (has_attr(e, "current") && number(attr(e, "current")) != n)
      refuse("<vcpu current='{}'>{}: vCPU hotplug; deja starts every vCPU it has", attr(e, "current"), *n);
    if (has_attr(e, "cpuset")) refuse("<vcpu cpuset='{}'>: pinning vCPUs to host CPUs; remove cpuset", attr(e, "cpuset"));
    auto vcpus = deja_vcpus_for_domain(unsigned(*n));
    if (!vcpus) return refused.push_back(vcpus.error().message);
    plan_.vcpus = *vcpus;
  }

  void os(xmlNode* e) {
    for (xmlNode* c : elements(e)) {
      const std::string n = name_of(c);
      if (n == "type") {
        if (text(c) != "hvm") refuse("<os><type>{}</type>: deja runs full (hvm) machines", text(c));
        const std::string arch = attr(c, "arch");
        if (!arch.empty() && arch != "x86_64") refuse("<os><type arch='{}'>: deja's machines are x86_64", arch);
        const std::string machine = attr(c, "machine");
        if (!machine.empty() && machine != "pc" && !machine.starts_with("pc-i440fx"))
          refuse("<os><type machine='{}'>: deja's machine is an i440FX-era PC (machine='pc'); q35's PCIe and "
                 "others are not there", machine);
      } else if (n == "kernel") {
        plan_.kernel = text(c);
      } else if (n == "initrd") {
        plan_.initrd = text(c);
      } else if (n == "cmdline") {
        plan_.cmdline = text(c);
      } else if (n == "boot" || n == "bootmenu") {
        boot_order_ = true;
      } else if (n == "loader" || n == "nvram" || n == "firmware") {
        refuse("<os><{}>: firmware boot (BIOS or UEFI); deja boots the kernel directly (<kernel>, <initrd>, <cmdline>)",
               n);
      } else if (n == "bios" || n == "smbios" || n == "acpi") {
        refuse("<os><{}>: firmware settings; deja's machine has no firmware", n);
      } else {
        refuse("<os><{}>: not something deja boots with", n);
      }
    }
    if (plan_.kernel.empty()) {
      refuse("<os> has no <kernel>: the domain boots through firmware (BIOS/UEFI) from a disk, which deja does not "
             "have; boot the kernel directly with <kernel>, <initrd> and <cmdline>");
    }
  }

  void features(xmlNode* e) {
    for (xmlNode* c : elements(e)) {
      const std::string n = name_of(c);
      if (n == "apic") plan_.machine = "pc-apic";
      else if (n == "pae") continue;  // every x86-64 CPU has it
      else if ((n == "vmport" || n == "smm" || n == "pvspinlock") && attr(c, "state") == "off") continue;
      else if (n == "acpi")
        refuse("<features><acpi/>: deja's machine has no ACPI tables (Linux boots without them, finding the PIC, or "
               "the APICs through the MP table with <apic/>); remove <acpi/>");
      else refuse("<features><{}>: not a feature deja's machine has", n);
    }
  }

  void cpu(xmlNode* e) {
    const std::string mode = attr(e, "mode");
    if (!mode.empty() && mode != "custom") {
      refuse("<cpu mode='{}'>: a recording presents a fixed, named CPU model whatever the host; remove the mode or name "
             "one of deja's: {}", mode, CpuModel::names());
    }
    for (xmlNode* c : elements(e)) {
      const std::string n = name_of(c);
      if (n == "model") {
        if (!CpuModel::find(text(c))) refuse("<cpu><model>{}</model>: deja's CPU models are {}", text(c), CpuModel::names());
        else plan_.cpu_model = text(c);
      } else if (n == "topology") {
        uint64_t product = 1;
        for (const char* a : {"sockets", "dies", "clusters", "cores", "threads"})
          if (has_attr(c, a)) product *= number(attr(c, a)).value_or(0);
        if (product != plan_.vcpus) refuse("<cpu><topology>: {} vCPUs, but deja gives the domain {}", product, plan_.vcpus);
      } else {
        refuse("<cpu><{}>: deja's CPU models are fixed as named ({}); remove it", n, CpuModel::names());
      }
    }
  }

  void clock(xmlNode* e) {
    const std::string offset = attr(e, "offset");
    if ((!offset.empty() && offset != "utc") || has_attr(e, "adjustment"))
      refuse("<clock offset='{}'{}>: deja's RTC starts at the host's UTC time (offset='utc')", offset,
             has_attr(e, "adjustment") ? " adjustment" : "");
    for (xmlNode* t : elements(e)) {
      const std::string name = attr(t, "name");
      const bool absent = attr(t, "present") == "no";
      if (name_of(t) == "timer" && absent && name != "pit" && name != "rtc") continue;  // deja has none of them
      refuse("<clock><timer name='{}'{}>: deja's PIT and RTC follow their own model in guest time (docs/devices.md); "
             "only present='no' for timers it does not have (hpet, kvmclock, hypervclock, tsc) is honoured",
             name, absent ? std::string(" present='no'") : attr_text(t, "tickpolicy"));
    }
  }

  void lifecycle(const std::string& what, const std::string& action) {
    if (action == "destroy") return;
    plan_.notes.push_back(fmt::format("<{}>{}</{}>: a deja run ends when the guest powers off, resets or stops", what,
                                      action, what));
  }

  void pm(xmlNode* e) {
    for (xmlNode* c : elements(e))
      if (attr(c, "enabled") == "yes") refuse("<pm><{} enabled='yes'>: deja's machine has no ACPI sleep states", name_of(c));
  }

  void devices(xmlNode* e) {
    bool addressed = false;
    for (xmlNode* d : elements(e)) {
      const std::string n = name_of(d);
      if (child(d, "address")) addressed = true;
      if (n == "emulator") plan_.notes.push_back("<emulator>" + text(d) + "</emulator>: deja is the emulator");
      else if (n == "disk") disk(d);
      else if (n == "interface") interface(d);
      else if (n == "serial" || n == "console") serial(d, n);
      else if (n == "rng") rng(d);
      else if (n == "memballoon") {
        if (attr(d, "model") != "none")
          refuse("<memballoon model='{}'>: deja has no balloon device; set <memballoon model='none'/>", attr(d, "model"));
      } else if (n == "controller") controller(d);
      else if (n == "input") {
        const std::string bus = attr(d, "bus"), type = attr(d, "type");
        if (bus == "ps2" && (type == "mouse" || type == "keyboard")) ps2_ = true;
        else refuse("<input type='{}' bus='{}'>: deja's console is the serial port; it has no input devices", type, bus);
      } else if (n == "graphics") {
        refuse("<graphics type='{}'>: deja has no display; the console is the serial port", attr(d, "type"));
      } else if (n == "video") {
        xmlNode* model = child(d, "model");
        if (!model || attr(model, "type") != "none")
          refuse("<video>: deja has no display adapter; remove it or set <model type='none'/>");
      } else if (n == "audio") {
        if (attr(d, "type") != "none") refuse("<audio type='{}'>: deja has no sound", attr(d, "type"));
      } else if (n == "hostdev") refuse("<hostdev>: PCI/USB passthrough hands a host device to the guest, whose behaviour "
                                        "a recording could not replay");
      else if (n == "filesystem") refuse("<filesystem>: host directories shared into the guest; use a disk image");
      else if (n == "channel") refuse("<channel>: deja has no virtio-serial (guest agents talk over it)");
      else refuse("<{}>: not a device deja's machine has", n);  // sound, watchdog, tpm, redirdev, panic, ...
    }
    if (ps2_) plan_.notes.push_back("libvirt's implicit PS/2 mouse and keyboard: deja's machine has no i8042");
    if (addressed)
      plan_.notes.push_back("<address>: deja places its PCI devices itself, on bus 0 in this order: disks, NICs, rng");
  }

  void disk(xmlNode* d) {
    xmlNode* target = child(d, "target");
    const std::string dev = target ? attr(target, "dev") : "";
    const std::string what = "disk '" + dev + "'";
    const std::string type = attr(d, "type"), device = attr(d, "device");
    if (type != "file") return refuse("{} (type='{}'): deja's disks are image files (type='file')", what, type);
    if (!device.empty() && device != "disk")
      return refuse("{} (device='{}'): deja's disks are virtio-blk disks (device='disk')", what, device);
    DiskOptions o;
    bool transient = false;
    std::string format;
    for (xmlNode* c : elements(d)) {
      const std::string n = name_of(c);
      if (n == "source") {
        o.path = attr(c, "file");
        for (xmlNode* s : elements(c)) refuse("{}: <source><{}>: not something deja's disks have", what, name_of(s));
      } else if (n == "driver") {
        format = attr(c, "type");
        for (const char* a : {"cache", "io", "discard", "detect_zeroes", "iothread", "queues", "error_policy",
                              "rerror_policy", "copy_on_read"})
          if (has_attr(c, a)) host_side(fmt::format("{} <driver {}='{}'>", what, a, attr(c, a)));
      } else if (n == "target") {
        if (attr(c, "bus") != "virtio")
          refuse("{} on bus '{}': deja's disks are virtio-blk (bus='virtio')", what, attr(c, "bus"));
      } else if (n == "readonly") {
        o.read_only = true;
      } else if (n == "transient") {
        transient = true;
      } else if (n == "backingStore") {
        if (!elements(c).empty()) refuse("{}: a backing chain (<backingStore>): deja reads one raw image", what);
      } else if (n == "alias" || n == "address") {
        continue;
      } else if (n == "boot") {
        boot_order_ = true;
      } else if (n == "iotune") {
        host_side(what + " <iotune>");
      } else {
        refuse("{}: <{}>: not something deja's disks have", what, n);
      }
    }
    if (o.path.empty()) return refuse("{} has no <source file>", what);
    if (!format.empty() && format != "raw") {
      const std::string ext = "." + format;
      const std::string raw = (o.path.ends_with(ext) ? o.path.substr(0, o.path.size() - ext.size()) : o.path) + ".raw";
      return refuse("{} is {} (<driver type='{}'>): deja reads raw images; convert it with `qemu-img convert -f {} -O "
                    "raw {} {}` and point <source file> at the copy", what, format, format, format, o.path, raw);
    }
    if (!o.read_only && !transient) {
      return refuse("{} is writable: deja never writes a disk image (the guest's writes go to an overlay); mark it "
                    "<transient/> (the writes are dropped at the end) or <readonly/>", what);
    }
    plan_.disks.push_back(o);
  }

  void interface(xmlNode* d) {
    const std::string type = attr(d, "type");
    const std::string what = fmt::format("<interface type='{}'>", type);
    if (type != "user") {
      return refuse("{}: deja's NICs are on libslirp's user-mode network (type='user', services reached through "
                    "<portForward>); bridges, tap devices, networks and passthrough are not there", what);
    }
    std::string spec = "user";
    bool virtio = false;
    for (xmlNode* c : elements(d)) {
      const std::string n = name_of(c);
      if (n == "mac") {
        spec += ",mac=" + attr(c, "address");
      } else if (n == "model") {
        virtio = attr(c, "type") == "virtio";
        if (!virtio) refuse("{} <model type='{}'>: deja's NICs are virtio-net (<model type='virtio'/>)", what,
                            attr(c, "type"));
      } else if (n == "portForward") {
        port_forward(c, spec);
      } else if (n == "backend") {
        if (has_attr(c, "type"))
          refuse("{} <backend type='{}'>: deja's user-mode network is libslirp", what, attr(c, "type"));
      } else if (n == "ip") {
        if (attr(c, "family") != "ipv4" || attr(c, "address") != "10.0.2.15")
          refuse("{} <ip address='{}'>: deja's user-mode network gives the guest 10.0.2.15", what, attr(c, "address"));
      } else if (n == "alias" || n == "address") {
        continue;
      } else if (n == "target") {
        host_side(what + " <target dev='" + attr(c, "dev") + "'>");
      } else if (n == "boot" || n == "rom") {
        boot_order_ = boot_order_ || n == "boot";
        if (n == "rom") refuse("{} <rom>: deja's machine has no option ROMs", what);
      } else {
        refuse("{} <{}>: not something deja's NICs have", what, n);
      }
    }
    if (!virtio) {
      if (!child(d, "model")) refuse("{} has no <model>: deja's NICs are virtio-net; add <model type='virtio'/>", what);
      return;
    }
    auto net = parse_net_option(spec);
    if (!net) return refuse("{}: {}", what, net.error().message);
    plan_.nets.push_back(*net);
  }

  void port_forward(xmlNode* f, std::string& spec) {
    const std::string proto = attr(f, "proto");
    if (has_attr(f, "dev")) return refuse("<portForward dev='{}'>: deja listens on addresses, not devices", attr(f, "dev"));
    const std::string address = attr(f, "address");
    for (xmlNode* r : elements(f)) {
      if (attr(r, "exclude") == "yes") {
        refuse("<portForward><range exclude='yes'>: deja forwards the ports named, nothing by exclusion");
        continue;
      }
      auto start = number(attr(r, "start"));
      auto end = has_attr(r, "end") ? number(attr(r, "end")) : start;
      auto to = has_attr(r, "to") ? number(attr(r, "to")) : start;
      if (!start || !end || !to || *end < *start || *end - *start > 1024 || *to + (*end - *start) > 65535) {
        refuse("<portForward><range start='{}' end='{}' to='{}'>: not a port range deja can forward", attr(r, "start"),
               attr(r, "end"), attr(r, "to"));
        continue;
      }
      for (uint64_t p = *start; p <= *end; ++p)
        spec += fmt::format(",hostfwd={}:{}:{}-:{}", proto, address, p, *to + (p - *start));
    }
  }

  void serial(xmlNode* d, const std::string& kind) {
    const std::string type = attr(d, "type");
    xmlNode* target = child(d, "target");
    const std::string port = target ? attr(target, "port") : "";
    const std::string target_type = target ? attr(target, "type") : "";
    const std::string what = fmt::format("<{} type='{}'>", kind, type);
    if (!port.empty() && port != "0") return refuse("{} on port {}: deja's machine has one serial port (COM1)", what, port);
    if (kind == "console" && !target_type.empty() && target_type != "serial")
      return refuse("{} <target type='{}'>: deja's console is the serial port (target type='serial')", what, target_type);
    if (kind == "serial" && !target_type.empty() && target_type != "isa-serial")
      return refuse("{} <target type='{}'>: deja's serial port is a 16550A on the ISA bus", what, target_type);
    std::string out;
    if (type == "file") {
      xmlNode* source = child(d, "source");
      out = source ? attr(source, "path") : "";
      if (out.empty()) return refuse("{} has no <source path>", what);
      if (source && attr(source, "append") == "on")
        return refuse("{} <source append='on'>: deja writes its serial output to a new file", what);
    } else if (type != "pty" && type != "stdio") {
      return refuse("{}: deja's serial port writes to its standard output (pty, stdio) or a file (type='file')", what);
    }
    for (xmlNode* c : elements(d)) {
      const std::string n = name_of(c);
      const bool isa_model = n == "model" && attr(c, "name") == "isa-serial";
      if (n != "source" && n != "target" && n != "alias" && n != "address" && !isa_model)
        refuse("{} <{}>: not something deja's serial port has", what, n);
    }
    if (serial_seen_ && out != plan_.serial_out)
      return refuse("{}: the serial port already goes to {}", what,
                    plan_.serial_out.empty() ? "standard output" : plan_.serial_out);
    serial_seen_ = true;
    plan_.serial_out = out;
  }

  void rng(xmlNode* d) {
    if (attr(d, "model") != "virtio")
      return refuse("<rng model='{}'>: deja's entropy device is virtio-rng", attr(d, "model"));
    for (xmlNode* c : elements(d)) {
      const std::string n = name_of(c);
      if (n == "backend" && attr(c, "model") == "random") continue;  // deja draws host entropy itself (getrandom)
      if (n == "alias" || n == "address") continue;
      if (n == "backend") refuse("<rng><backend model='{}'>: deja's virtio-rng draws the host's entropy", attr(c, "model"));
      else if (n == "rate") refuse("<rng><rate>: deja's virtio-rng has no rate limit");
      else refuse("<rng><{}>: not something deja's virtio-rng has", n);
    }
    if (plan_.rng) return refuse("a second <rng>: deja's machine has one entropy device");
    plan_.rng = true;
  }

  void controller(xmlNode* d) {
    const std::string type = attr(d, "type"), model = attr(d, "model");
    if (type == "pci" && (model == "pci-root" || model.empty())) return;
    if (type == "usb" && model == "none") return;
    if (type == "ide") return plan_.notes.push_back("<controller type='ide'>: nothing is attached to it in deja");
    if (type == "usb")
      return refuse("<controller type='usb' model='{}'>: deja has no USB; set <controller type='usb' model='none'/>",
                    model);
    refuse("<controller type='{}'{}>: deja's machine has a PCI root bus only", type, attr_text(d, "model"));
  }

  DomainPlan& plan_;
  std::optional<uint64_t> current_memory_;
  std::vector<std::string> host_side_;
  bool boot_order_ = false;
  bool ps2_ = false;
  bool serial_seen_ = false;
};

}  // namespace

Result<unsigned> deja_vcpus_for_domain(unsigned asked) {
  // One vCPU a machine today: when deja runs several (--cpus), this passes `asked` through up to its limit.
  constexpr unsigned kMaxVcpus = 1;
  if (asked > kMaxVcpus) {
    return fail(ErrorKind::kUnsupported, "<vcpu>{}</vcpu>: deja runs {} vCPU a machine today; set <vcpu>1</vcpu>", asked,
                kMaxVcpus);
  }
  return asked;
}

namespace {

Result<> validate_doc(xmlDoc* doc, const std::string& schema_path) {
  Messages messages;
  xmlRelaxNGParserCtxtPtr pctxt = xmlRelaxNGNewParserCtxt(schema_path.c_str());
  if (!pctxt) return fail(ErrorKind::kHost, "cannot read libvirt's schema {}", schema_path);
  xmlRelaxNGSetParserStructuredErrors(pctxt, [](void* self, xmlErrorPtr e) { Messages::structured(self, e); }, &messages);
  xmlRelaxNGPtr schema = xmlRelaxNGParse(pctxt);
  xmlRelaxNGFreeParserCtxt(pctxt);
  if (!schema) return fail(ErrorKind::kHost, "cannot read libvirt's schema {}:{}", schema_path, messages.joined());
  xmlRelaxNGValidCtxtPtr vctxt = xmlRelaxNGNewValidCtxt(schema);
  xmlRelaxNGSetValidStructuredErrors(vctxt, [](void* self, xmlErrorPtr e) { Messages::structured(self, e); }, &messages);
  const int r = xmlRelaxNGValidateDoc(vctxt, doc);
  xmlRelaxNGFreeValidCtxt(vctxt);
  xmlRelaxNGFree(schema);
  if (r != 0) {
    return fail(ErrorKind::kInvalidArgument, "not a valid libvirt domain (libvirt's schema {}):{}", schema_path,
                messages.joined());
  }
  return {};
}

}  // namespace

Result<> validate_against_schema(std::string_view xml, const std::string& schema_path) {
  auto doc = parse(xml, "the domain");
  if (!doc) return std::unexpected(doc.error());
  return validate_doc(doc->get(), schema_path);
}

Result<DomainPlan> import_domain_xml(std::string_view xml, const std::string& source,
                                     const DomainImportOptions& options) {
  DomainPlan plan;
  plan.source = source;
  plan.xml_sha256 = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(xml.data()), xml.size()));
  if (xml.size() > kMaxDomainXmlBytes)
    return fail(ErrorKind::kInvalidArgument, "{}: {} bytes, more than a domain's XML ({} at most)", source, xml.size(),
                kMaxDomainXmlBytes);
  auto doc = parse(xml, source);
  if (!doc) return std::unexpected(doc.error());
  if (!options.schema.empty()) {
    if (::access(options.schema.c_str(), R_OK) == 0) {
      if (auto ok = validate_doc(doc->get(), options.schema); !ok)
        return fail(ok.error().kind, "{}: {}", source, ok.error().message);
      plan.schema_validated = true;
    }
  }
  xmlNode* root = xmlDocGetRootElement(doc->get());
  if (!root || name_of(root) != "domain")
    return fail(ErrorKind::kInvalidArgument, "{}: the root element is <{}>, not <domain>", source, root ? name_of(root) : "");
  Mapper mapper(plan);
  mapper.domain(root);
  if (!mapper.refused.empty()) {
    std::string list;
    for (const auto& r : mapper.refused) list += "\n  - " + r;
    return fail(ErrorKind::kUnsupported, "{}: domain '{}' asks for what deja cannot honour:{}", source, plan.name, list);
  }
  return plan;
}

Result<DomainPlan> import_domain_file(const std::string& path, const DomainImportOptions& options) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open the domain XML {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(ErrorKind::kInvalidArgument, "the domain XML {} is not a regular file", path);
  }
  std::string xml;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    xml.append(buf, size_t(n));
    if (xml.size() > kMaxDomainXmlBytes) break;
  }
  ::close(fd);
  return import_domain_xml(xml, "file " + path, options);
}

}  // namespace deja
