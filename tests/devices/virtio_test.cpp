// Virtio: the split virtqueue's rules (every hostile chain), the PCI transport (capabilities, negotiation, status,
// reset, ISR, notifications, DEVICE_NEEDS_RESET) and the block, network and entropy devices behind it.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "devices/virtio_blk.h"
#include "devices/virtio_net.h"
#include "devices/virtio_pci.h"
#include "devices/virtio_rng.h"
#include "tests/devices/fakes.h"

namespace deja {
namespace {

constexpr uint64_t kRam = 16ull << 20;

// The driver's side of one split virtqueue in guest memory.
class Driver {
 public:
  Driver(GuestMemory& memory, uint16_t size, uint64_t base = 0x10000)
      : m_(memory), size_(size), desc_(base), avail_(base + 16 * size), used_((avail_ + 6 + 2 * size + 3) & ~3ull) {}

  void set_desc(uint16_t i, uint64_t addr, uint32_t len, uint16_t flags = 0, uint16_t next = 0,
                uint64_t table = 0) {
    uint8_t d[16];
    store_le(std::span(d, 8), addr);
    store_le(std::span(d + 8, 4), len);
    store_le(std::span(d + 12, 2), flags);
    store_le(std::span(d + 14, 2), next);
    ASSERT_TRUE(m_.write(Gpa{(table ? table : desc_) + 16ull * i}, d));
  }
  void publish(uint16_t head) {
    put16(avail_ + 4 + 2 * (avail_idx_ % size_), head);
    put16(avail_ + 2, ++avail_idx_);
  }
  void set_avail_idx(uint16_t idx) {
    avail_idx_ = idx;
    put16(avail_ + 2, idx);
  }
  void set_avail_flags(uint16_t f) { put16(avail_, f); }
  void set_used_event(uint16_t v) { put16(avail_ + 4 + 2 * size_, v); }
  uint16_t used_idx() { return get16(used_ + 2); }
  uint16_t avail_event() { return get16(used_ + 4 + 8 * size_); }
  std::pair<uint32_t, uint32_t> used(uint16_t i) {
    uint8_t e[8];
    EXPECT_TRUE(m_.read(Gpa{used_ + 4 + 8 * (i % size_)}, e));
    return {uint32_t(load_le(std::span(e, 4))), uint32_t(load_le(std::span(e + 4, 4)))};
  }
  void program(Virtqueue& q) {
    q.reset(size_);
    q.desc = desc_;
    q.avail = avail_;
    q.used = used_;
    q.enabled = true;
  }
  uint64_t desc() const { return desc_; }
  uint64_t avail() const { return avail_; }
  uint64_t used_ring() const { return used_; }
  uint16_t size() const { return size_; }

 private:
  void put16(uint64_t at, uint16_t v) {
    uint8_t b[2] = {uint8_t(v), uint8_t(v >> 8)};
    ASSERT_TRUE(m_.write(Gpa{at}, b));
  }
  uint16_t get16(uint64_t at) {
    uint8_t b[2] = {};
    EXPECT_TRUE(m_.read(Gpa{at}, b));
    return uint16_t(b[0] | b[1] << 8);
  }
  GuestMemory& m_;
  uint16_t size_;
  uint64_t desc_, avail_, used_;
  uint16_t avail_idx_ = 0;
};

class VirtqueueTest : public ::testing::Test {
 protected:
  VirtqueueTest() : memory(std::move(*GuestMemory::create(kRam))), driver(memory, 8) { driver.program(queue); }

  std::string pop_error(VirtqFeatures f = {.indirect = true, .event_idx = false}) {
    auto r = queue.pop(memory, f);
    if (r) return r->has_value() ? "a chain" : "empty";
    return r.error().message;
  }

  GuestMemory memory;
  Driver driver;
  Virtqueue queue;
};

TEST_F(VirtqueueTest, TakesChainsAndReturnsThem) {
  EXPECT_EQ(pop_error(), "empty");
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext, 3);
  driver.set_desc(3, 0x100100, 512, virtq::kDescNext | virtq::kDescWrite, 5);
  driver.set_desc(5, 0x100400, 1, virtq::kDescWrite);
  driver.publish(0);
  EXPECT_EQ(*queue.available(memory), 1);
  auto chain = queue.pop(memory, {});
  ASSERT_TRUE(chain && *chain);
  EXPECT_EQ((*chain)->head, 0);
  ASSERT_EQ((*chain)->readable.size(), 1u);
  ASSERT_EQ((*chain)->writable.size(), 2u);
  EXPECT_EQ((*chain)->readable[0].gpa, 0x100000u);
  EXPECT_EQ((*chain)->writable_bytes, 513u);
  EXPECT_EQ(*queue.available(memory), 0);
  ASSERT_TRUE(queue.push(memory, 0, 513));
  EXPECT_EQ(driver.used_idx(), 1);
  EXPECT_EQ(driver.used(0), std::make_pair(0u, 513u));
  EXPECT_TRUE(*queue.needs_interrupt(memory, {}));
  driver.set_avail_flags(virtq::kAvailNoInterrupt);
  EXPECT_FALSE(*queue.needs_interrupt(memory, {}));
}

TEST_F(VirtqueueTest, LoopInTheChain) {
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext, 1);
  driver.set_desc(1, 0x100000, 16, virtq::kDescNext, 2);
  driver.set_desc(2, 0x100000, 16, virtq::kDescNext, 0);
  driver.publish(0);
  EXPECT_NE(pop_error().find("longer than the queue size"), std::string::npos) << pop_error();
}

TEST_F(VirtqueueTest, SelfLoop) {
  driver.set_desc(4, 0x100000, 16, virtq::kDescNext, 4);
  driver.publish(4);
  EXPECT_NE(pop_error().find("longer than the queue size"), std::string::npos);
}

TEST_F(VirtqueueTest, IndexOutOfRange) {
  driver.publish(8);  // head beyond the queue
  EXPECT_NE(pop_error().find("beyond the queue size"), std::string::npos);
}

TEST_F(VirtqueueTest, NextOutOfRange) {
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext, 200);
  driver.publish(0);
  EXPECT_NE(pop_error().find("names descriptor 200"), std::string::npos) << pop_error();
}

TEST_F(VirtqueueTest, AvailableIndexTooFarAhead) {
  driver.set_avail_idx(9);  // queue size 8
  EXPECT_FALSE(queue.available(memory));
  EXPECT_NE(pop_error().find("ahead of the device"), std::string::npos);
}

TEST_F(VirtqueueTest, BufferOutsideRam) {
  driver.set_desc(0, kRam - 8, 16);
  driver.publish(0);
  EXPECT_NE(pop_error().find("outside RAM"), std::string::npos);
}

TEST_F(VirtqueueTest, BufferAddressWrapsAround) {
  driver.set_desc(0, 0xfffffffffffffff0ull, 0x20);
  driver.publish(0);
  EXPECT_NE(pop_error().find("outside RAM"), std::string::npos);
}

TEST_F(VirtqueueTest, LengthOverFourGiB) {
  // Every descriptor lies in RAM (the whole 16 MiB, read 256 times over): together they exceed 4 GiB.
  Driver big(memory, 256, 0x20000);
  big.program(queue);
  for (uint16_t i = 0; i < 256; ++i) big.set_desc(i, 0, uint32_t(kRam), i < 255 ? virtq::kDescNext : 0, uint16_t(i + 1));
  big.publish(0);
  EXPECT_NE(pop_error().find("4 GiB"), std::string::npos) << pop_error();
}

TEST_F(VirtqueueTest, SingleDescriptorOfFourGiB) {
  driver.set_desc(0, 0x1000, 0xffffffff);
  driver.publish(0);
  EXPECT_NE(pop_error().find("outside RAM"), std::string::npos);
}

TEST_F(VirtqueueTest, ReadableAfterWritable) {
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext | virtq::kDescWrite, 1);
  driver.set_desc(1, 0x100100, 16);
  driver.publish(0);
  EXPECT_NE(pop_error().find("device-readable buffer after a device-writable"), std::string::npos);
}

TEST_F(VirtqueueTest, IndirectTableWorks) {
  const uint64_t table = 0x200000;
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext, 1, table);
  driver.set_desc(1, 0x100100, 1, virtq::kDescWrite, 0, table);
  // Direct descriptors may precede the indirect one (virtio 1.1, 2.6.5.3.2).
  driver.set_desc(6, 0x100200, 8, virtq::kDescNext, 2);
  driver.set_desc(2, table, 32, virtq::kDescIndirect);
  driver.publish(6);
  auto chain = queue.pop(memory, {.indirect = true});
  ASSERT_TRUE(chain && *chain);
  EXPECT_EQ((*chain)->readable.size(), 2u);
  EXPECT_EQ((*chain)->writable.size(), 1u);
}

TEST_F(VirtqueueTest, IndirectWithoutTheFeature) {
  driver.set_desc(0, 0x200000, 32, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error({.indirect = false}).find("VIRTIO_F_INDIRECT_DESC was not negotiated"), std::string::npos);
}

TEST_F(VirtqueueTest, NestedIndirect) {
  const uint64_t table = 0x200000;
  driver.set_desc(0, 0x300000, 16, virtq::kDescIndirect, 0, table);
  driver.set_desc(0, table, 16, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error().find("indirect table inside one"), std::string::npos);
}

TEST_F(VirtqueueTest, IndirectWithNext) {
  driver.set_desc(0, 0x200000, 16, virtq::kDescIndirect | virtq::kDescNext, 1);
  driver.publish(0);
  EXPECT_NE(pop_error().find("both INDIRECT and NEXT"), std::string::npos);
}

TEST_F(VirtqueueTest, IndirectTableOfBadLength) {
  driver.set_desc(0, 0x200000, 24, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error().find("not a non-zero multiple of 16"), std::string::npos);
}

TEST_F(VirtqueueTest, EmptyIndirectTable) {
  driver.set_desc(1, 0x200000, 0, virtq::kDescIndirect);
  driver.publish(1);
  EXPECT_NE(pop_error().find("not a non-zero multiple of 16"), std::string::npos);
}

TEST_F(VirtqueueTest, IndirectTableOutsideRam) {
  driver.set_desc(0, kRam - 16, 32, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error().find("outside RAM"), std::string::npos);
}

TEST_F(VirtqueueTest, IndirectChainTooLong) {
  // A loop-free indirect table of 64 entries behind a queue of 8: longer than the queue size.
  const uint64_t table = 0x200000;
  for (uint16_t i = 0; i < 64; ++i) driver.set_desc(i, 0x100000, 1, i < 63 ? virtq::kDescNext : 0, uint16_t(i + 1), table);
  driver.set_desc(0, table, 64 * 16, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error().find("longer than the queue size"), std::string::npos) << pop_error();
}

TEST_F(VirtqueueTest, IndirectLoop) {
  const uint64_t table = 0x200000;
  driver.set_desc(0, 0x100000, 1, virtq::kDescNext, 1, table);
  driver.set_desc(1, 0x100000, 1, virtq::kDescNext, 0, table);
  driver.set_desc(0, table, 32, virtq::kDescIndirect);
  driver.publish(0);
  EXPECT_NE(pop_error().find("longer than the queue size"), std::string::npos);
}

TEST_F(VirtqueueTest, EventIndex) {
  const VirtqFeatures f{.indirect = false, .event_idx = true};
  driver.set_desc(0, 0x100000, 1, virtq::kDescWrite);
  driver.set_desc(1, 0x100000, 1, virtq::kDescWrite);
  driver.publish(0);
  driver.publish(1);
  ASSERT_TRUE(queue.pop(memory, f));
  EXPECT_EQ(driver.avail_event(), 1) << "the device publishes its position for the driver's notifications";
  ASSERT_TRUE(queue.pop(memory, f));
  EXPECT_EQ(driver.avail_event(), 2);
  // The driver wants an interrupt once the used index passes used_event.
  driver.set_used_event(1);
  ASSERT_TRUE(queue.push(memory, 0, 1));
  EXPECT_TRUE(*queue.needs_interrupt(memory, f)) << "the first check always signals";
  ASSERT_TRUE(queue.push(memory, 1, 1));
  EXPECT_TRUE(*queue.needs_interrupt(memory, f)) << "used index 2 passed used_event 1";
  driver.set_used_event(5);
  driver.publish(0);
  ASSERT_TRUE(queue.pop(memory, f));
  ASSERT_TRUE(queue.push(memory, 0, 1));
  EXPECT_FALSE(*queue.needs_interrupt(memory, f)) << "used index 3 has not reached used_event 5";
}

TEST_F(VirtqueueTest, LayoutChecks) {
  Virtqueue q;
  q.reset(256);
  q.size = 100;
  EXPECT_TRUE(q.check_layout(memory, 256).has_value()) << "not a power of two";
  q.size = 512;
  EXPECT_TRUE(q.check_layout(memory, 256).has_value()) << "above the maximum";
  q.size = 256;
  q.desc = 0x1008;
  EXPECT_TRUE(q.check_layout(memory, 256).has_value()) << "misaligned";
  q.desc = kRam - 16;
  EXPECT_TRUE(q.check_layout(memory, 256).has_value()) << "outside RAM";
  q.desc = 0x1000;
  q.avail = 0x10000;
  q.used = 0x20000;
  EXPECT_FALSE(q.check_layout(memory, 256).has_value());
}

TEST_F(VirtqueueTest, ReaderAndWriterStreamAcrossBuffers) {
  std::vector<VirtqBuffer> buffers{{0x100000, 3}, {0x100010, 0}, {0x100020, 5}};
  VirtqWriter w(memory, buffers);
  const uint8_t data[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(w.write(data), 8u);
  EXPECT_EQ(w.written(), 8u);
  VirtqReader r(memory, buffers);
  r.skip(2);
  EXPECT_EQ(r.remaining(), 6u);
  uint8_t out[10] = {};
  EXPECT_EQ(r.read(out), 6u);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 4);
  EXPECT_EQ(out[5], 8);
}

// ---- the PCI transport ----------------------------------------------------------------------------------

// A device with two queues that records what the transport tells it.
class FakeDevice : public VirtioDevice {
 public:
  std::string_view name() const override { return "fake"; }
  uint16_t device_id() const override { return 0x1f; }
  uint32_t pci_class() const override { return 0xff0000; }
  uint64_t device_features() const override { return 1ull << 3; }
  unsigned queue_count() const override { return 2; }
  uint16_t queue_max_size() const override { return 64; }
  unsigned config_size() const override { return 4; }
  void read_config(unsigned offset, std::span<uint8_t> data) override {
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(0xa0 + offset + i);
  }
  void reset() override { ++resets; }
  void queue_notified(unsigned q) override { notified.push_back(q); }
  void save(StateWriter& w) const override { w.u32(resets); }
  void restore(StateReader& r) override { resets = r.u32(); }
  VirtioTransport& t() { return transport(); }

  unsigned resets = 0;
  std::vector<unsigned> notified;
};

class VirtioPciTest : public ::testing::Test {
 protected:
  VirtioPciTest() : memory(std::move(*GuestMemory::create(kRam))), pci(device, memory), driver(memory, 64) {}

  uint64_t common(unsigned offset, unsigned size) {
    uint8_t b[8] = {};
    pci.read(VirtioPci::kCommonOffset + offset, std::span(b, size));
    return load_le(std::span(b, size));
  }
  void set_common(unsigned offset, unsigned size, uint64_t v) {
    uint8_t b[8];
    store_le(std::span(b, size), v);
    pci.write(VirtioPci::kCommonOffset + offset, std::span(b, size));
  }
  void notify(uint16_t q) {
    uint8_t b[2] = {uint8_t(q), 0};
    pci.write(VirtioPci::kNotifyOffset + q * VirtioPci::kNotifyMultiplier, b);
  }
  uint8_t isr() {
    uint8_t b = 0;
    pci.read(VirtioPci::kIsrOffset, std::span(&b, 1));
    return b;
  }
  // The driver's initialization sequence (virtio 1.1, 3.1.1) with queue 0 set up.
  void initialize(uint64_t features = virtio::kFeatureVersion1) {
    set_common(VirtioPci::kDeviceStatus, 1, 0);
    set_common(VirtioPci::kDeviceStatus, 1, virtio::kStatusAcknowledge | virtio::kStatusDriver);
    set_common(VirtioPci::kDriverFeatureSelect, 4, 0);
    set_common(VirtioPci::kDriverFeature, 4, uint32_t(features));
    set_common(VirtioPci::kDriverFeatureSelect, 4, 1);
    set_common(VirtioPci::kDriverFeature, 4, uint32_t(features >> 32));
    set_common(VirtioPci::kDeviceStatus, 1, virtio::kStatusAcknowledge | virtio::kStatusDriver |
                                                virtio::kStatusFeaturesOk);
    set_common(VirtioPci::kQueueSelect, 2, 0);
    set_common(VirtioPci::kQueueSize, 2, driver.size());
    set_common(VirtioPci::kQueueDesc, 8, driver.desc());
    set_common(VirtioPci::kQueueDriver, 8, driver.avail());
    set_common(VirtioPci::kQueueDevice, 8, driver.used_ring());
    set_common(VirtioPci::kQueueEnable, 2, 1);
  }
  void driver_ok() {
    set_common(VirtioPci::kDeviceStatus, 1, virtio::kStatusAcknowledge | virtio::kStatusDriver |
                                                virtio::kStatusFeaturesOk | virtio::kStatusDriverOk);
  }

  GuestMemory memory;
  FakeDevice device;
  VirtioPci pci;
  Driver driver;
};

TEST_F(VirtioPciTest, IdentityAndCapabilities) {
  EXPECT_EQ(pci.config_read(0, 4), 0x105f1af4u);  // vendor 1af4, device 0x1040 + 0x1f
  EXPECT_EQ(pci.config_read(pci::kRevision, 1), 1u);
  EXPECT_EQ(pci.bar_kind(VirtioPci::kBar), PciBarKind::kMemory64);
  std::map<uint8_t, std::pair<uint32_t, uint32_t>> caps;  // cfg_type -> (offset, length)
  uint32_t multiplier = 0;
  for (uint32_t at = pci.config_read(pci::kCapabilityPointer, 1); at; at = pci.config_read(at + 1, 1)) {
    ASSERT_EQ(pci.config_read(at, 1), pci::kCapabilityVendor);
    const uint8_t type = uint8_t(pci.config_read(at + 3, 1));
    EXPECT_EQ(pci.config_read(at + 4, 1), type == VirtioPci::kCapPciCfg ? 0u : VirtioPci::kBar);
    caps[type] = {pci.config_read(at + 8, 4), pci.config_read(at + 12, 4)};
    if (type == VirtioPci::kCapNotify) multiplier = pci.config_read(at + 16, 4);
  }
  ASSERT_EQ(caps.size(), 5u);
  EXPECT_EQ(caps[VirtioPci::kCapCommon].first, VirtioPci::kCommonOffset);
  EXPECT_GE(caps[VirtioPci::kCapCommon].second, 0x38u);
  EXPECT_EQ(caps[VirtioPci::kCapIsr].first, VirtioPci::kIsrOffset);
  EXPECT_EQ(caps[VirtioPci::kCapDevice].second, 4u);
  EXPECT_EQ(multiplier, VirtioPci::kNotifyMultiplier);
}

TEST_F(VirtioPciTest, FeatureNegotiation) {
  set_common(VirtioPci::kDeviceFeatureSelect, 4, 0);
  const uint64_t low = common(VirtioPci::kDeviceFeature, 4);
  set_common(VirtioPci::kDeviceFeatureSelect, 4, 1);
  const uint64_t high = common(VirtioPci::kDeviceFeature, 4);
  EXPECT_EQ(low | high << 32, (1ull << 3) | virtio::kTransportFeatures);
  set_common(VirtioPci::kDeviceFeatureSelect, 4, 2);
  EXPECT_EQ(common(VirtioPci::kDeviceFeature, 4), 0u);
  // Without VERSION_1, FEATURES_OK does not stick.
  initialize(1ull << 3);
  EXPECT_FALSE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusFeaturesOk);
  // Nor with a feature the device did not offer.
  initialize(virtio::kFeatureVersion1 | (1ull << 4));
  EXPECT_FALSE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusFeaturesOk);
  initialize(virtio::kFeatureVersion1 | (1ull << 3));
  EXPECT_TRUE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusFeaturesOk);
  EXPECT_EQ(pci.negotiated(), virtio::kFeatureVersion1 | (1ull << 3));
  // After FEATURES_OK the driver's features are fixed.
  set_common(VirtioPci::kDriverFeatureSelect, 4, 0);
  set_common(VirtioPci::kDriverFeature, 4, 0);
  EXPECT_EQ(pci.negotiated(), virtio::kFeatureVersion1 | (1ull << 3));
}

TEST_F(VirtioPciTest, QueueRegistersAndReset) {
  EXPECT_EQ(common(VirtioPci::kNumQueues, 2), 2u);
  set_common(VirtioPci::kQueueSelect, 2, 1);
  EXPECT_EQ(common(VirtioPci::kQueueSize, 2), 64u) << "the maximum, after reset";
  EXPECT_EQ(common(VirtioPci::kQueueNotifyOff, 2), 1u);
  EXPECT_EQ(common(VirtioPci::kQueueMsixVector, 2), VirtioPci::kNoVector);
  set_common(VirtioPci::kQueueSelect, 2, 7);
  EXPECT_EQ(common(VirtioPci::kQueueSize, 2), 0u) << "an unavailable queue reads size 0";
  initialize();
  set_common(VirtioPci::kQueueSelect, 2, 0);
  EXPECT_EQ(common(VirtioPci::kQueueEnable, 2), 1u);
  EXPECT_EQ(common(VirtioPci::kQueueDesc, 8), driver.desc());
  // An enabled queue's registers are fixed until reset.
  set_common(VirtioPci::kQueueDesc, 8, 0x5000);
  EXPECT_EQ(common(VirtioPci::kQueueDesc, 8), driver.desc());
  set_common(VirtioPci::kDeviceStatus, 1, 0);
  EXPECT_EQ(common(VirtioPci::kDeviceStatus, 1), 0u);
  EXPECT_EQ(common(VirtioPci::kQueueEnable, 2), 0u);
  EXPECT_EQ(common(VirtioPci::kQueueDesc, 8), 0u);
  EXPECT_EQ(device.resets, 2u);  // once in initialize(), once here
}

TEST_F(VirtioPciTest, NotificationsWaitForDriverOk) {
  initialize();
  notify(0);
  EXPECT_TRUE(device.notified.empty()) << "no buffers are consumed before DRIVER_OK";
  driver_ok();
  EXPECT_EQ(device.notified, std::vector<unsigned>{0});
  notify(0);
  notify(1);  // not enabled
  notify(9);  // no such queue
  EXPECT_EQ(device.notified, (std::vector<unsigned>{0, 0}));
}

TEST_F(VirtioPciTest, IsrAndInterrupts) {
  initialize();
  driver_ok();
  driver.set_desc(0, 0x100000, 1, virtq::kDescWrite);
  driver.publish(0);
  auto chain = device.t().pop(0);
  ASSERT_TRUE(chain);
  device.t().push(0, chain->head, 1);
  device.t().notify_used(0);
  EXPECT_TRUE(pci.intx_output());
  EXPECT_EQ(isr(), 1);
  EXPECT_FALSE(pci.intx_output()) << "reading the ISR de-asserts INTx";
  EXPECT_EQ(isr(), 0);
}

TEST_F(VirtioPciTest, HostileChainNeedsReset) {
  initialize();
  driver_ok();
  driver.set_desc(0, 0x100000, 16, virtq::kDescNext, 0);  // a loop
  driver.publish(0);
  EXPECT_FALSE(device.t().pop(0));
  EXPECT_TRUE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusNeedsReset);
  EXPECT_EQ(isr(), 2) << "a configuration-change interrupt tells the driver";
  EXPECT_NE(pci.last_error().find("longer than the queue size"), std::string::npos);
  EXPECT_FALSE(pci.queue_ready(0));
  notify(0);
  EXPECT_TRUE(device.notified.empty());
  // The driver cannot clear DEVICE_NEEDS_RESET except by resetting.
  set_common(VirtioPci::kDeviceStatus, 1, 0x0f);
  EXPECT_TRUE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusNeedsReset);
  set_common(VirtioPci::kDeviceStatus, 1, 0);
  EXPECT_EQ(common(VirtioPci::kDeviceStatus, 1), 0u);
}

TEST_F(VirtioPciTest, BadLayoutNeedsReset) {
  set_common(VirtioPci::kDeviceStatus, 1, virtio::kStatusAcknowledge | virtio::kStatusDriver);
  set_common(VirtioPci::kQueueSelect, 2, 0);
  set_common(VirtioPci::kQueueSize, 2, 48);  // not a power of two
  set_common(VirtioPci::kQueueEnable, 2, 1);
  EXPECT_EQ(common(VirtioPci::kQueueEnable, 2), 0u);
  EXPECT_TRUE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusNeedsReset);
}

TEST_F(VirtioPciTest, DriverOkWithoutFeaturesOk) {
  set_common(VirtioPci::kDeviceStatus, 1, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusDriverOk);
  EXPECT_TRUE(common(VirtioPci::kDeviceStatus, 1) & virtio::kStatusNeedsReset);
}

TEST_F(VirtioPciTest, DeviceConfigurationAndWindow) {
  uint8_t b[4] = {};
  pci.read(VirtioPci::kDeviceOffset + 1, std::span(b, 2));
  EXPECT_EQ(b[0], 0xa1);
  // The PCI configuration access capability reaches the common configuration: num_queues at 0x12.
  const uint8_t cap = pci.pci_cfg_capability();
  pci.config_write(cap + 4, 1, VirtioPci::kBar);
  pci.config_write(cap + 8, 4, VirtioPci::kCommonOffset + VirtioPci::kNumQueues);
  pci.config_write(cap + 12, 4, 2);
  EXPECT_EQ(pci.config_read(cap + 16, 4) & 0xffff, 2u);
  // ... and writes through it: device_status.
  pci.config_write(cap + 8, 4, VirtioPci::kCommonOffset + VirtioPci::kDeviceStatus);
  pci.config_write(cap + 12, 4, 1);
  pci.config_write(cap + 16, 4, virtio::kStatusAcknowledge);
  EXPECT_EQ(pci.status(), virtio::kStatusAcknowledge);
  // A misaligned window is ignored.
  pci.config_write(cap + 8, 4, 0x13);
  pci.config_write(cap + 12, 4, 2);
  pci.config_write(cap + 16, 4, 0);
  EXPECT_EQ(pci.status(), virtio::kStatusAcknowledge);
}

TEST_F(VirtioPciTest, SaveRestore) {
  initialize();
  driver_ok();
  auto blob = pci.save();
  set_common(VirtioPci::kDeviceStatus, 1, 0);
  ASSERT_TRUE(pci.restore(blob));
  EXPECT_TRUE(pci.queue_ready(0));
  EXPECT_EQ(pci.save(), blob);
  blob.resize(blob.size() - 1);
  EXPECT_FALSE(pci.restore(blob));
}

class FakeMsi : public MsiSink {
 public:
  void deliver_msi(uint64_t address, uint32_t data) override { messages.emplace_back(address, data); }
  std::vector<std::pair<uint64_t, uint32_t>> messages;
};

class VirtioMsixTest : public VirtioPciTest {
 protected:
  VirtioMsixTest() : msix(device, memory, &msi) {}
  void set(unsigned offset, unsigned size, uint64_t v) {
    uint8_t b[8];
    store_le(std::span(b, size), v);
    msix.write(VirtioPci::kCommonOffset + offset, std::span(b, size));
  }
  uint16_t get16(unsigned offset) {
    uint8_t b[2] = {};
    msix.read(VirtioPci::kCommonOffset + offset, b);
    return uint16_t(b[0] | b[1] << 8);
  }
  void table(unsigned entry, unsigned dword, uint32_t v) {
    uint8_t b[4];
    store_le(b, v);
    msix.bar_write(VirtioPci::kMsixBar, 16 * entry + 4 * dword, b);
  }
  uint64_t pending() {
    uint8_t b[8] = {};
    msix.bar_read(VirtioPci::kMsixBar, VirtioPci::kMsixPbaOffset, b);
    return load_le(b);
  }
  void bring_up_queue0() {
    set(VirtioPci::kDeviceStatus, 1, 3);
    set(VirtioPci::kDriverFeatureSelect, 4, 1);
    set(VirtioPci::kDriverFeature, 4, 1);
    set(VirtioPci::kDeviceStatus, 1, 0xb);
    set(VirtioPci::kQueueSelect, 2, 0);
    set(VirtioPci::kQueueSize, 2, driver.size());
    set(VirtioPci::kQueueDesc, 8, driver.desc());
    set(VirtioPci::kQueueDriver, 8, driver.avail());
    set(VirtioPci::kQueueDevice, 8, driver.used_ring());
    set(VirtioPci::kQueueEnable, 2, 1);
    set(VirtioPci::kDeviceStatus, 1, 0xf);
  }
  void use_one_buffer() {
    driver.set_desc(0, 0x100000, 1, virtq::kDescWrite);
    driver.publish(0);
    auto chain = device.t().pop(0);
    ASSERT_TRUE(chain);
    device.t().push(0, chain->head, 1);
    device.t().notify_used(0);
  }

  FakeMsi msi;
  FakeDevice device;  // a second device: the fixture's own is bound to the INTx-only transport
  VirtioPci msix;
};

TEST_F(VirtioMsixTest, CapabilityAndTable) {
  const uint8_t cap = msix.msix_capability();
  ASSERT_NE(cap, 0);
  EXPECT_EQ(msix.config_read(cap, 1), pci::kCapabilityMsix);
  EXPECT_EQ(msix.config_read(cap + 2, 2) & 0x7ff, 2u) << "3 vectors: 2 queues + configuration";
  EXPECT_EQ(msix.config_read(cap + 4, 4), VirtioPci::kMsixBar);
  EXPECT_EQ(msix.config_read(cap + 8, 4), VirtioPci::kMsixPbaOffset | VirtioPci::kMsixBar);
  EXPECT_EQ(msix.bar_kind(VirtioPci::kMsixBar), PciBarKind::kMemory32);
  EXPECT_EQ(pci.msix_capability(), 0) << "no MSI-X without somewhere to send it";
  uint8_t control[4] = {};
  msix.bar_read(VirtioPci::kMsixBar, 12, control);
  EXPECT_EQ(control[0], 1) << "entries start masked";
  // Vectors the table does not have read back NO_VECTOR.
  set(VirtioPci::kMsixConfig, 2, 2);
  EXPECT_EQ(get16(VirtioPci::kMsixConfig), 2);
  set(VirtioPci::kMsixConfig, 2, 3);
  EXPECT_EQ(get16(VirtioPci::kMsixConfig), VirtioPci::kNoVector);
}

TEST_F(VirtioMsixTest, NotificationsGoToTheQueuesVector) {
  bring_up_queue0();
  set(VirtioPci::kQueueSelect, 2, 0);
  set(VirtioPci::kQueueMsixVector, 2, 1);
  table(1, 0, 0xfee00000);
  table(1, 1, 0);
  table(1, 2, 0x41);
  table(1, 3, 0);  // unmask
  msix.config_write(msix.msix_capability() + 2, 2, 0x8000 | 2);  // enable
  use_one_buffer();
  ASSERT_EQ(msi.messages.size(), 1u);
  EXPECT_EQ(msi.messages[0], std::make_pair(uint64_t(0xfee00000), uint32_t(0x41)));
  EXPECT_FALSE(msix.intx_output()) << "INTx is not used while MSI-X is enabled";
}

TEST_F(VirtioMsixTest, MaskedVectorsArePendingUntilUnmasked) {
  bring_up_queue0();
  set(VirtioPci::kQueueSelect, 2, 0);
  set(VirtioPci::kQueueMsixVector, 2, 0);
  table(0, 0, 0xfee00000);
  table(0, 2, 0x42);
  msix.config_write(msix.msix_capability() + 2, 2, 0x8000 | 2);
  use_one_buffer();
  EXPECT_TRUE(msi.messages.empty());
  EXPECT_EQ(pending(), 1u);
  table(0, 3, 0);
  ASSERT_EQ(msi.messages.size(), 1u);
  EXPECT_EQ(pending(), 0u);
  // The function mask holds every vector.
  msix.config_write(msix.msix_capability() + 2, 2, 0xc000 | 2);
  use_one_buffer();
  EXPECT_EQ(msi.messages.size(), 1u);
  msix.config_write(msix.msix_capability() + 2, 2, 0x8000 | 2);
  EXPECT_EQ(msi.messages.size(), 2u);
  // NO_VECTOR: no interrupt at all.
  set(VirtioPci::kQueueMsixVector, 2, VirtioPci::kNoVector);
  use_one_buffer();
  EXPECT_EQ(msi.messages.size(), 2u);
  EXPECT_EQ(pending(), 0u);
  // State round trip.
  auto blob = msix.save();
  ASSERT_TRUE(msix.restore(blob));
  EXPECT_EQ(msix.save(), blob);
}

// ---- devices ----------------------------------------------------------------------------------------------

class MemoryStore : public BlockStore {
 public:
  explicit MemoryStore(size_t size, bool ro = false) : bytes(size), ro_(ro) {
    for (size_t i = 0; i < size; ++i) bytes[i] = uint8_t(i * 7);
  }
  uint64_t size_bytes() const override { return bytes.size(); }
  bool read_only() const override { return ro_; }
  Result<> read(uint64_t offset, std::span<uint8_t> out) override {
    std::copy_n(bytes.begin() + offset, out.size(), out.begin());
    return {};
  }
  Result<> write(uint64_t offset, std::span<const uint8_t> data) override {
    std::copy(data.begin(), data.end(), bytes.begin() + offset);
    return {};
  }
  Result<> write_zeroes(uint64_t offset, uint64_t length) override {
    std::fill_n(bytes.begin() + offset, length, uint8_t{0});
    return {};
  }
  Result<> flush() override {
    ++flushes;
    return {};
  }
  std::vector<uint8_t> save() const override { return {1, 2, 3}; }
  Result<> restore(std::span<const uint8_t>) override { return {}; }
  std::vector<uint8_t> bytes;
  int flushes = 0;

 private:
  bool ro_;
};

class VirtioBlkTest : public ::testing::Test {
 protected:
  VirtioBlkTest()
      : memory(std::move(*GuestMemory::create(kRam))), store(64 * 1024), blk(store, "deja-test-serial"),
        pci(blk, memory), driver(memory, 64) {
    set(VirtioPci::kDeviceStatus, 1, 0);
    set(VirtioPci::kDeviceStatus, 1, 3);
    set(VirtioPci::kDriverFeatureSelect, 4, 0);
    set(VirtioPci::kDriverFeature, 4, uint32_t(blk.device_features() | virtio::kFeatureIndirectDesc));
    set(VirtioPci::kDriverFeatureSelect, 4, 1);
    set(VirtioPci::kDriverFeature, 4, 1);
    set(VirtioPci::kDeviceStatus, 1, 0xb);
    set(VirtioPci::kQueueSize, 2, 64);
    set(VirtioPci::kQueueDesc, 8, driver.desc());
    set(VirtioPci::kQueueDriver, 8, driver.avail());
    set(VirtioPci::kQueueDevice, 8, driver.used_ring());
    set(VirtioPci::kQueueEnable, 2, 1);
    set(VirtioPci::kDeviceStatus, 1, 0xf);
  }
  void set(unsigned offset, unsigned size, uint64_t v) {
    uint8_t b[8];
    store_le(std::span(b, size), v);
    pci.write(VirtioPci::kCommonOffset + offset, std::span(b, size));
  }
  // Sends one request: header at 0x100000, data at 0x101000 (`data_len` bytes, device-writable for reads),
  // status at 0x180000. Returns the status byte and the used length.
  std::pair<uint8_t, uint32_t> request(uint32_t type, uint64_t sector, uint32_t data_len, bool data_writable,
                                       bool with_status = true) {
    uint8_t header[16] = {};
    store_le(std::span(header, 4), type);
    store_le(std::span(header + 8, 8), sector);
    EXPECT_TRUE(memory.write(Gpa{0x100000}, header));
    const uint8_t ff = 0xff;
    EXPECT_TRUE(memory.write(Gpa{0x180000}, std::span(&ff, 1)));
    uint16_t n = 0;
    driver.set_desc(n, 0x100000, 16, virtq::kDescNext, uint16_t(n + 1));
    ++n;
    if (data_len) {
      driver.set_desc(n, 0x101000, data_len, uint16_t(virtq::kDescNext | (data_writable ? virtq::kDescWrite : 0)),
                      uint16_t(n + 1));
      ++n;
    }
    if (with_status) {
      driver.set_desc(n, 0x180000, 1, virtq::kDescWrite);
    } else {
      driver.set_desc(uint16_t(n - 1), data_len ? 0x101000 : 0x100000, data_len ? data_len : 16,
                      data_len && data_writable ? virtq::kDescWrite : 0);
    }
    driver.publish(0);
    uint8_t notify[2] = {0, 0};
    pci.write(VirtioPci::kNotifyOffset, notify);
    EXPECT_EQ(blk.next_deadline_ns(), std::optional<uint64_t>(0)) << "due at once";
    blk.advance(1000);
    uint8_t status = 0;
    EXPECT_TRUE(memory.read(Gpa{0x180000}, std::span(&status, 1)));
    return {status, driver.used(uint16_t(driver.used_idx() - 1)).second};
  }

  GuestMemory memory;
  MemoryStore store;
  VirtioBlk blk;
  VirtioPci pci;
  Driver driver;
};

TEST_F(VirtioBlkTest, Configuration) {
  uint8_t c[virtio_blk::kConfigSize] = {};
  pci.read(VirtioPci::kDeviceOffset, c);
  EXPECT_EQ(load_le(std::span(c, 8)), 128u);  // 64 KiB in sectors
  EXPECT_EQ(load_le(std::span(c + 12, 4)), 254u);
  EXPECT_EQ(load_le(std::span(c + 20, 4)), 512u);
}

TEST_F(VirtioBlkTest, ReadWriteFlushId) {
  auto [status, used] = request(virtio_blk::kTypeIn, 2, 1024, true);
  EXPECT_EQ(status, virtio_blk::kStatusOk);
  EXPECT_EQ(used, 1025u);
  uint8_t data[1024];
  ASSERT_TRUE(memory.read(Gpa{0x101000}, data));
  EXPECT_TRUE(std::equal(data, data + 1024, store.bytes.begin() + 1024));
  std::fill_n(data, 512, uint8_t{0x42});
  ASSERT_TRUE(memory.write(Gpa{0x101000}, std::span(data, 512)));
  EXPECT_EQ(request(virtio_blk::kTypeOut, 10, 512, false), std::make_pair(virtio_blk::kStatusOk, 1u));
  EXPECT_EQ(store.bytes[10 * 512], 0x42);
  EXPECT_EQ(request(virtio_blk::kTypeFlush, 0, 0, false), std::make_pair(virtio_blk::kStatusOk, 1u));
  EXPECT_EQ(store.flushes, 1);
  EXPECT_EQ(request(virtio_blk::kTypeGetId, 0, 20, true), std::make_pair(virtio_blk::kStatusOk, 21u));
  char id[21] = {};
  ASSERT_TRUE(memory.read(Gpa{0x101000}, std::span(reinterpret_cast<uint8_t*>(id), 20)));
  EXPECT_STREQ(id, "deja-test-serial");
  EXPECT_TRUE(pci.intx_output());
}

TEST_F(VirtioBlkTest, BadRequests) {
  EXPECT_EQ(request(virtio_blk::kTypeIn, 127, 1024, true).first, virtio_blk::kStatusIoErr) << "past the end";
  EXPECT_EQ(request(virtio_blk::kTypeIn, ~0ull / 512, 512, true).first, virtio_blk::kStatusIoErr) << "overflowing";
  EXPECT_EQ(request(virtio_blk::kTypeIn, 0, 100, true).first, virtio_blk::kStatusIoErr) << "not whole sectors";
  EXPECT_EQ(request(virtio_blk::kTypeOut, 0, 100, false).first, virtio_blk::kStatusIoErr);
  EXPECT_EQ(request(99, 0, 0, false).first, virtio_blk::kStatusUnsupp);
  EXPECT_EQ(request(10, 0, 0, false).first, virtio_blk::kStatusUnsupp) << "GET_LIFETIME is not offered";
  EXPECT_EQ(pci.status() & virtio::kStatusNeedsReset, 0);
}

TEST_F(VirtioBlkTest, DiscardAndWriteZeroes) {
  uint8_t segment[16] = {};
  store_le(std::span(segment, 8), 4);       // sector
  store_le(std::span(segment + 8, 4), 2);   // sectors
  ASSERT_TRUE(memory.write(Gpa{0x101000}, segment));
  EXPECT_EQ(request(virtio_blk::kTypeDiscard, 0, 16, false).first, virtio_blk::kStatusOk);
  EXPECT_EQ(store.bytes[4 * 512], 0);
  EXPECT_EQ(store.bytes[6 * 512], uint8_t(6 * 512 * 7));
  store_le(std::span(segment + 12, 4), 1);  // unmap: not for DISCARD
  ASSERT_TRUE(memory.write(Gpa{0x101000}, segment));
  EXPECT_EQ(request(virtio_blk::kTypeDiscard, 0, 16, false).first, virtio_blk::kStatusUnsupp);
  EXPECT_EQ(request(virtio_blk::kTypeWriteZeroes, 0, 16, false).first, virtio_blk::kStatusOk);
  store_le(std::span(segment + 12, 4), 2);  // an unknown flag
  ASSERT_TRUE(memory.write(Gpa{0x101000}, segment));
  EXPECT_EQ(request(virtio_blk::kTypeWriteZeroes, 0, 16, false).first, virtio_blk::kStatusUnsupp);
  store_le(std::span(segment, 8), 127);     // past the end
  store_le(std::span(segment + 12, 4), 0);
  ASSERT_TRUE(memory.write(Gpa{0x101000}, segment));
  EXPECT_EQ(request(virtio_blk::kTypeWriteZeroes, 0, 16, false).first, virtio_blk::kStatusIoErr);
  EXPECT_EQ(request(virtio_blk::kTypeWriteZeroes, 0, 32, false).first, virtio_blk::kStatusIoErr) << "two segments";
}

TEST_F(VirtioBlkTest, ReadOnly) {
  MemoryStore ro(4096, true);
  VirtioBlk device(ro, "ro");
  EXPECT_TRUE(device.device_features() & virtio_blk::kFeatureRo);
}

TEST_F(VirtioBlkTest, NoStatusByteNeedsReset) {
  request(virtio_blk::kTypeOut, 0, 512, false, /*with_status=*/false);
  EXPECT_TRUE(pci.status() & virtio::kStatusNeedsReset);
}

class FakeEntropy : public Entropy {
 public:
  void fill(std::span<uint8_t> out) override {
    for (auto& b : out) b = next++;
    calls.push_back(out.size());
  }
  uint8_t next = 1;
  std::vector<size_t> calls;
};

class FakeNetwork : public NetworkPort {
 public:
  void transmit(unsigned nic, std::span<const uint8_t> frame) override {
    frames.emplace_back(nic, std::vector<uint8_t>(frame.begin(), frame.end()));
  }
  std::vector<std::pair<unsigned, std::vector<uint8_t>>> frames;
};

// Brings a transport to DRIVER_OK with `queues` queues of 64 entries at 0x10000 + 0x4000 q.
void bring_up(VirtioPci& pci, GuestMemory& memory, unsigned queues) {
  auto set = [&](unsigned offset, unsigned size, uint64_t v) {
    uint8_t b[8];
    store_le(std::span(b, size), v);
    pci.write(VirtioPci::kCommonOffset + offset, std::span(b, size));
  };
  set(VirtioPci::kDeviceStatus, 1, 3);
  set(VirtioPci::kDriverFeatureSelect, 4, 1);
  set(VirtioPci::kDriverFeature, 4, 1);
  set(VirtioPci::kDeviceStatus, 1, 0xb);
  for (unsigned q = 0; q < queues; ++q) {
    Driver d(memory, 64, 0x10000 + 0x4000 * q);
    set(VirtioPci::kQueueSelect, 2, q);
    set(VirtioPci::kQueueDesc, 8, d.desc());
    set(VirtioPci::kQueueDriver, 8, d.avail());
    set(VirtioPci::kQueueDevice, 8, d.used_ring());
    set(VirtioPci::kQueueEnable, 2, 1);
  }
  set(VirtioPci::kDeviceStatus, 1, 0xf);
}

TEST(VirtioRng, FillsBuffersFromTheEntropyPortBounded) {
  auto memory = std::move(*GuestMemory::create(kRam));
  FakeEntropy entropy;
  VirtioRng rng(entropy);
  VirtioPci pci(rng, memory);
  bring_up(pci, memory, 1);
  Driver d(memory, 64, 0x10000);
  d.set_desc(0, 0x100000, 16, virtq::kDescWrite);
  d.set_desc(1, 0x200000, 1 << 20, virtq::kDescWrite);  // a huge buffer: capped
  d.publish(0);
  d.publish(1);
  uint8_t n[2] = {};
  pci.write(VirtioPci::kNotifyOffset, n);
  ASSERT_EQ(rng.next_deadline_ns(), std::optional<uint64_t>(0));
  rng.advance(5);
  EXPECT_EQ(rng.next_deadline_ns(), std::nullopt);
  EXPECT_EQ(entropy.calls, (std::vector<size_t>{16, VirtioRng::kMaxBytesPerRequest}));
  EXPECT_EQ(d.used(0).second, 16u);
  EXPECT_EQ(d.used(1).second, VirtioRng::kMaxBytesPerRequest);
  uint8_t got[2] = {};
  ASSERT_TRUE(memory.read(Gpa{0x100000}, got));
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 2);
}

TEST(VirtioNet, TransmitAndReceive) {
  auto memory = std::move(*GuestMemory::create(kRam));
  FakeNetwork network;
  VirtioNet net(network, 0, {0x52, 0x54, 0, 0x12, 0x34, 0x56});
  VirtioPci pci(net, memory);
  bring_up(pci, memory, 2);
  uint8_t mac[6] = {};
  pci.read(VirtioPci::kDeviceOffset, mac);
  EXPECT_EQ(mac[5], 0x56);
  // Transmit: header + frame in two descriptors.
  Driver tx(memory, 64, 0x14000);
  std::vector<uint8_t> frame(60, 0xab);
  ASSERT_TRUE(memory.write(Gpa{0x300000}, frame));
  tx.set_desc(0, 0x2ff000, virtio_net::kHeaderSize, virtq::kDescNext, 1);
  tx.set_desc(1, 0x300000, 60);
  tx.publish(0);
  tx.set_desc(2, 0x300000, 9000);  // longer than any frame: dropped
  tx.publish(2);
  uint8_t n[2] = {1, 0};
  pci.write(VirtioPci::kNotifyOffset + VirtioPci::kNotifyMultiplier, n);
  ASSERT_EQ(network.frames.size(), 1u);
  EXPECT_EQ(network.frames[0].second, frame);
  EXPECT_EQ(net.counters().tx_dropped, 1u);
  EXPECT_EQ(tx.used_idx(), 2);
  // Receive: one buffer available; the second frame finds none and is dropped.
  Driver rx(memory, 64, 0x10000);
  EXPECT_EQ(net.rx_capacity(), 0);
  rx.set_desc(0, 0x400000, 2048, virtq::kDescWrite);
  rx.publish(0);
  EXPECT_EQ(net.rx_capacity(), 1);
  std::vector<uint8_t> in(100, 0xcd);
  std::span<const uint8_t> frames[] = {in, in};
  net.receive(frames);
  EXPECT_EQ(net.counters().rx_frames, 1u);
  EXPECT_EQ(net.counters().rx_dropped, 1u);
  EXPECT_EQ(rx.used(0).second, virtio_net::kHeaderSize + 100);
  uint8_t header[virtio_net::kHeaderSize];
  ASSERT_TRUE(memory.read(Gpa{0x400000}, header));
  EXPECT_EQ(header[10], 1) << "num_buffers";
  EXPECT_EQ(header[0], 0);
}

}  // namespace
}  // namespace deja
