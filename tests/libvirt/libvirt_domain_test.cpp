// Domain XML in and out: libvirt's schema, the mapping to deja's machine, each refusal, and the libvirt API's test driver.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "libvirt/domain_export.h"
#include "libvirt/domain_import.h"
#include "logging/trace_format.h"

namespace deja {
namespace {

bool have_schema() { return ::access(kLibvirtDomainSchema, R_OK) == 0; }

// A domain deja runs: direct kernel boot, a transient raw virtio disk, a user-mode NIC with a port forward, the serial
// console, an entropy device, and what libvirt always lists (PS/2 inputs, the PCI root) or must be told not to add.
std::string runnable_domain(const std::string& extra_devices = "", const std::string& os_extra = "") {
  return R"(<domain type='kvm'>
  <name>web1</name>
  <uuid>c7a5fdbd-cdaf-9455-926a-d65c16db1809</uuid>
  <memory unit='MiB'>256</memory>
  <currentMemory unit='KiB'>262144</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type>
    <kernel>/boot/vmlinuz</kernel>
    <initrd>/boot/initrd.img</initrd>
    <cmdline>console=ttyS0 quiet</cmdline>)" + os_extra + R"(
  </os>
  <features><apic/><pae/></features>
  <clock offset='utc'><timer name='hpet' present='no'/></clock>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='/var/lib/libvirt/images/web1.raw'/>
      <target dev='vda' bus='virtio'/>
      <transient/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='/var/lib/libvirt/images/data.raw'/>
      <target dev='vdb' bus='virtio'/>
      <readonly/>
    </disk>
    <controller type='usb' index='0' model='none'/>
    <controller type='pci' index='0' model='pci-root'/>
    <interface type='user'>
      <mac address='52:54:00:aa:bb:cc'/>
      <portForward proto='tcp'>
        <range start='2222' to='22'/>
      </portForward>
      <model type='virtio'/>
    </interface>
    <serial type='pty'><target type='isa-serial' port='0'><model name='isa-serial'/></target></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <input type='mouse' bus='ps2'/>
    <input type='keyboard' bus='ps2'/>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <memballoon model='none'/>)" + extra_devices + R"(
  </devices>
</domain>
)";
}

TEST(LibvirtImport, MapsWhatDejaHonours) {
  auto plan = import_domain_xml(runnable_domain(), "test");
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(plan->name, "web1");
  EXPECT_EQ(plan->uuid, "c7a5fdbd-cdaf-9455-926a-d65c16db1809");
  EXPECT_EQ(plan->memory_bytes, 256u << 20);
  EXPECT_EQ(plan->vcpus, 1u);
  EXPECT_EQ(plan->machine, "pc-apic");
  EXPECT_EQ(plan->kernel, "/boot/vmlinuz");
  EXPECT_EQ(plan->initrd, "/boot/initrd.img");
  EXPECT_EQ(plan->cmdline, "console=ttyS0 quiet");
  ASSERT_EQ(plan->disks.size(), 2u);
  EXPECT_EQ(plan->disks[0].path, "/var/lib/libvirt/images/web1.raw");
  EXPECT_FALSE(plan->disks[0].read_only);
  EXPECT_TRUE(plan->disks[0].overlay.empty());  // transient: the writes stay in memory
  EXPECT_TRUE(plan->disks[1].read_only);
  ASSERT_EQ(plan->nets.size(), 1u);
  ASSERT_TRUE(plan->nets[0].mac);
  EXPECT_EQ((*plan->nets[0].mac)[5], 0xcc);
  ASSERT_EQ(plan->nets[0].forwards.size(), 1u);
  EXPECT_EQ(plan->nets[0].forwards[0].host_port, 2222);
  EXPECT_EQ(plan->nets[0].forwards[0].guest_port, 22);
  EXPECT_TRUE(plan->rng);
  EXPECT_EQ(plan->serial_out, "");
  EXPECT_EQ(plan->schema_validated, have_schema());
  std::string notes;
  for (const auto& n : plan->notes) notes += n + "\n";
  // Nothing dropped silently: what deja took as it is, it says.
  for (const char* said : {"<emulator>", "on_reboot", "cache='none'", "PS/2", "<address>"})
    EXPECT_NE(notes.find(said), std::string::npos) << said << " not in:\n" << notes;
  const std::string xml = runnable_domain();
  EXPECT_EQ(plan->xml_sha256, sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(xml.data()), xml.size())));
}

TEST(LibvirtImport, SchemaViolationsAreLibvirtsOwnWords) {
  if (!have_schema()) GTEST_SKIP() << kLibvirtDomainSchema << " is not installed (libvirt0)";
  std::string xml = runnable_domain();
  xml.replace(xml.find("<vcpu placement='static'>1</vcpu>"), 33, "<vcpu placement='static'>one</vcpu>");
  auto plan = import_domain_xml(xml, "file bad.xml");
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find("not a valid libvirt domain"), std::string::npos) << plan.error().message;
  EXPECT_NE(plan.error().message.find("line "), std::string::npos) << plan.error().message;
  auto broken = import_domain_xml("<domain type='kvm'><name>x</name>", "file broken.xml");
  ASSERT_FALSE(broken);
  EXPECT_NE(broken.error().message.find("not well-formed"), std::string::npos) << broken.error().message;
}

// Every kind of thing deja cannot honour is refused by name, all at once, with what to do instead.
TEST(LibvirtImport, RefusesByName) {
  struct Case {
    std::string devices, os, says;
  };
  const std::vector<Case> cases = {
      {"<interface type='bridge'><source bridge='br0'/><model type='virtio'/></interface>", "", "bridges"},
      {"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x03' "
       "slot='0x00' function='0x0'/></source></hostdev>", "", "passthrough"},
      {"<graphics type='vnc' port='-1' autoport='yes'/>", "", "no display"},
      {"<video><model type='cirrus'/></video>", "", "display adapter"},
      {"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/img/a.qcow2'/>"
       "<target dev='vdc' bus='virtio'/><transient/></disk>", "", "qemu-img convert -f qcow2 -O raw /img/a.qcow2 /img/a.raw"},
      {"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/img/w.raw'/>"
       "<target dev='vdc' bus='virtio'/></disk>", "", "is writable"},
      {"<disk type='file' device='disk'><source file='/img/s.raw'/><target dev='sda' bus='sata'/><readonly/></disk>",
       "", "virtio-blk"},
      {"<memballoon model='virtio'/>", "", "no balloon"},
      {"<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>", "", "virtio-serial"},
      {"", "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader>", "firmware boot"},
  };
  for (const Case& c : cases) {
    std::string xml = runnable_domain(c.devices, c.os);
    if (c.says == "no balloon") xml.replace(xml.find("<memballoon model='none'/>"), 26, "");
    auto plan = import_domain_xml(xml, "test");
    ASSERT_FALSE(plan) << c.says;
    EXPECT_NE(plan.error().message.find(c.says), std::string::npos) << plan.error().message;
    EXPECT_NE(plan.error().message.find("cannot honour"), std::string::npos) << plan.error().message;
  }
}

// The test driver's own domain (what `virsh -c test:///default dumpxml test` prints) is refused on every count.
TEST(LibvirtImport, TheTestDriversDomainIsRefusedOnEveryCount) {
  const std::string xml = R"(<domain type='test' id='1'>
  <name>test</name>
  <uuid>6695eb01-f6a4-8304-79aa-97f2502e193f</uuid>
  <memory unit='KiB'>8388608</memory>
  <currentMemory unit='KiB'>2097152</currentMemory>
  <vcpu placement='static'>2</vcpu>
  <os><type arch='i686'>hvm</type><boot dev='hd'/></os>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot><on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'><source file='/guest/diskimage1'/><target dev='vda' bus='virtio'/></disk>
    <interface type='network'><mac address='aa:bb:cc:dd:ee:ff'/><source network='default'/></interface>
    <memballoon model='virtio'/>
  </devices>
</domain>)";
  auto plan = import_domain_xml(xml, "test");
  ASSERT_FALSE(plan);
  for (const char* said : {"<vcpu>2</vcpu>", "arch='i686'", "no <kernel>", "type='network'", "balloon", "writable"})
    EXPECT_NE(plan.error().message.find(said), std::string::npos) << said << " in:\n" << plan.error().message;
}

TEST(LibvirtImport, VcpusAreLimitedInOnePlace) {
  EXPECT_EQ(deja_vcpus_for_domain(1).value_or(0), 1u);
  auto two = deja_vcpus_for_domain(2);
  ASSERT_FALSE(two);
  EXPECT_NE(two.error().message.find("1 vCPU"), std::string::npos) << two.error().message;
}

trace::Header recorded_header() {
  trace::Header h;
  h.set_format_version(kTraceFormatVersion);
  h.set_deja_version("0.1.0");
  h.set_build_id("test");
  h.set_cpu_model("x86-64-v1");
  auto* kernel = h.add_inputs();
  kernel->set_role("kernel");
  kernel->set_path("/boot/vmlinuz & friends");
  kernel->set_sha256(std::string(32, '\1'));
  auto* initrd = h.add_inputs();
  initrd->set_role("initrd");
  initrd->set_path("/boot/initrd.img");
  auto* c = h.mutable_config();
  c->set_memory_bytes(256u << 20);
  c->set_vcpus(1);
  c->set_backend("interp");
  c->set_machine("pc");
  c->set_progress_mode("exact");
  c->set_cmdline("console=ttyS0 <quiet>");
  auto* d = c->add_disks();
  d->set_path("/img/disk.raw");
  d->set_read_only(false);
  auto* n = c->add_nets();
  n->set_mode("user");
  n->add_host_forwards("tcp::8080-:80");
  n->set_mac(std::string("\x52\x54\x00\x12\x34\x56", 6));
  c->set_rng(true);
  return h;
}

TEST(LibvirtExport, ValidatesAndImportsBackToTheSameMachine) {
  const trace::Header h = recorded_header();
  const std::string xml = export_domain_xml(h, "/traces/run.trace");
  if (have_schema()) {
    auto valid = validate_against_schema(xml, kLibvirtDomainSchema);
    EXPECT_TRUE(valid) << valid.error().message << "\n" << xml;
  }
  auto plan = import_domain_xml(xml, "exported");
  ASSERT_TRUE(plan) << plan.error().message << "\n" << xml;
  EXPECT_EQ(plan->name, "deja-run");
  EXPECT_EQ(plan->memory_bytes, h.config().memory_bytes());
  EXPECT_EQ(plan->kernel, "/boot/vmlinuz & friends");
  EXPECT_EQ(plan->initrd, "/boot/initrd.img");
  EXPECT_EQ(plan->cmdline, "console=ttyS0 <quiet>");
  EXPECT_EQ(plan->machine, "pc");
  ASSERT_EQ(plan->disks.size(), 1u);
  EXPECT_EQ(plan->disks[0].path, "/img/disk.raw");
  ASSERT_EQ(plan->nets.size(), 1u);
  EXPECT_EQ(plan->nets[0].forward_texts, std::vector<std::string>{"tcp::8080-:80"});
  ASSERT_TRUE(plan->nets[0].mac);
  EXPECT_EQ((*plan->nets[0].mac)[5], 0x56);
  EXPECT_TRUE(plan->rng);
  EXPECT_NE(xml.find(kDejaMetadataNamespace), std::string::npos);
  // The domain a recording came from keeps its name and UUID.
  trace::Header from_libvirt = h;
  from_libvirt.mutable_libvirt_domain()->set_name("web1");
  from_libvirt.mutable_libvirt_domain()->set_uuid("c7a5fdbd-cdaf-9455-926a-d65c16db1809");
  auto again = import_domain_xml(export_domain_xml(from_libvirt, "x.trace"), "exported");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->name, "web1");
  EXPECT_EQ(again->uuid, "c7a5fdbd-cdaf-9455-926a-d65c16db1809");
}

TEST(LibvirtApi, FetchesFromTheTestDriver) {
  if (!libvirt_api_available()) {
    auto r = fetch_libvirt_domain_xml("test", "test:///default");
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("libvirt-dev"), std::string::npos);
    GTEST_SKIP() << "built without the libvirt API";
  }
  auto xml = fetch_libvirt_domain_xml("test", "test:///default");
  ASSERT_TRUE(xml) << xml.error().message;
  EXPECT_NE(xml->find("<name>test</name>"), std::string::npos);
  auto missing = fetch_libvirt_domain_xml("no-such-domain", "test:///default");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("no-such-domain"), std::string::npos) << missing.error().message;

  // A node of the test driver defined by a file: the runnable domain fetched by name imports.
  const auto dir = std::filesystem::temp_directory_path() / ("deja-libvirt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string domain = runnable_domain();
  domain.replace(domain.find("type='kvm'"), 10, "type='test'");
  { std::ofstream(dir / "node.xml") << "<node>\n" << domain << "</node>\n"; }
  auto fetched = fetch_libvirt_domain_xml("web1", "test://" + (dir / "node.xml").string());
  ASSERT_TRUE(fetched) << fetched.error().message;
  auto plan = import_domain_xml(*fetched, "libvirt test");
  ASSERT_TRUE(plan) << plan.error().message << "\n" << *fetched;
  EXPECT_EQ(plan->name, "web1");
  EXPECT_EQ(plan->disks.size(), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deja
