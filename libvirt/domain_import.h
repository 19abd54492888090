// A libvirt domain (`virsh dumpxml`, or fetched through the libvirt API) as deja's machine options: validated against
// libvirt's own RelaxNG schema, then mapped element by element; whatever deja cannot honour is refused by name.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "vmm/disk_image.h"
#include "vmm/user_network.h"

namespace deja {

// Where Debian's libvirt0 installs the schema `virsh` validates domains with.
inline constexpr const char* kLibvirtDomainSchema = "/usr/share/libvirt/schemas/domain.rng";

// What a domain asks of deja's machine. Every field comes from an element deja honours; `notes` names what deja took
// as it is because it has no meaning here (host-side tuning, libvirt's implicit PS/2 devices, PCI addresses).
struct DomainPlan {
  std::string name;
  std::string uuid;                    // as libvirt writes it ("" when the XML has none)
  std::array<uint8_t, 32> xml_sha256{};  // of the XML as read
  std::string source;                  // "file PATH", or "libvirt URI, domain NAME"
  uint64_t memory_bytes = 0;           // <memory>
  unsigned vcpus = 1;                  // <vcpu> (deja_vcpus_for_domain)
  std::string machine = "pc";          // "pc", or "pc-apic" for <features><apic/>
  std::string cpu_model;               // <cpu><model> naming one of deja's models; "" = the default
  std::string kernel, initrd, cmdline;  // <os><kernel>, <initrd>, <cmdline>: direct kernel boot
  std::vector<DiskOptions> disks;      // virtio raw disks, in document order (<readonly/>, <transient/>)
  std::vector<NetOptions> nets;        // <interface type='user'> with <model type='virtio'/>, <mac>, <portForward>
  std::string serial_out;              // <serial type='file'>: its path; "" = deja's standard output (pty, stdio)
  bool rng = false;                    // <rng model='virtio'>
  bool schema_validated = false;       // libvirt's schema was there and the XML passed it
  std::vector<std::string> notes;
};

struct DomainImportOptions {
  std::string schema = kLibvirtDomainSchema;  // "" = do not validate (tests of deja's own checks)
};

// The vCPUs deja gives a domain asking for `asked` (<vcpu>): the one place that changes when deja runs several.
Result<unsigned> deja_vcpus_for_domain(unsigned asked);

// `xml` is the domain's XML; `source` says where it came from, for messages and the trace header. Fails with every
// problem listed: a schema violation (with libvirt's wording and the line), or each element deja cannot honour with
// what to do instead.
Result<DomainPlan> import_domain_xml(std::string_view xml, const std::string& source,
                                     const DomainImportOptions& options = {});
// Reads FILE (at most 4 MiB) and imports it.
Result<DomainPlan> import_domain_file(const std::string& path, const DomainImportOptions& options = {});

// The libvirt C API (optional at build time: libvirt-dev): the XML of domain `name` on connection `uri` ("" = libvirt's
// default). Without libvirt, an error saying how to build deja with it.
Result<std::string> fetch_libvirt_domain_xml(const std::string& name, const std::string& uri);
bool libvirt_api_available();

// Checks `xml` against the RelaxNG schema at `schema_path`; the error lists libxml2's messages.
Result<> validate_against_schema(std::string_view xml, const std::string& schema_path);

}  // namespace deja
