// The virtio PCI transport, modern (virtio 1.x): one PCI function whose BAR 4 holds the common, ISR, device and
// notify structures that its vendor capabilities point to; a VirtioDevice plugs in behind it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "devices/device.h"
#include "devices/interrupts.h"
#include "devices/pci_function.h"
#include "devices/virtio.h"

namespace deja {

// Virtio 1.1, 4.1 "Virtio Over PCI Bus", non-transitional: device ID 0x1040 + the virtio device ID, revision 1,
// no legacy I/O BAR. Layout of BAR 4 (64-bit, prefetchable, 16 KiB, as QEMU lays out its modern BAR):
//   0x0000 common configuration (struct virtio_pci_common_cfg, 56 bytes)
//   0x1000 ISR status (1 byte: bit 0 used buffers, bit 1 configuration change; a read returns and clears it)
//   0x2000 device-specific configuration
//   0x3000 notifications: queue q at 0x3000 + 4 q (notify_off_multiplier 4, queue_notify_off q)
// Capabilities (vendor-specific, ID 9): common, notify, ISR, device (only with a device configuration), and the
// PCI configuration access capability (cfg_type 5), whose window reaches BAR 4 through configuration space. Interrupts are INTx only (no MSI-X
// capability): msix_config and queue_msix_vector read NO_VECTOR (0xffff), writes are ignored.
//
// Status: writing 0 resets the device. FEATURES_OK is kept only when the driver's features are a subset of the
// offered ones and include VIRTIO_F_VERSION_1; driver features written after FEATURES_OK are ignored. Queue
// registers are writable while the selected queue is disabled; enabling checks the layout. The device consumes
// buffers only after DRIVER_OK (notifications that came earlier are delivered then). When the driver breaks a
// rule (a bad layout, a hostile descriptor chain, DRIVER_OK without FEATURES_OK), the device sets
// DEVICE_NEEDS_RESET, sends a configuration-change interrupt if DRIVER_OK was set, and stops processing until reset.
class VirtioPci : public PciFunction, public Device, public VirtioTransport {
 public:
  static constexpr unsigned kBar = 4;
  static constexpr unsigned kMsixBar = 1;
  static constexpr uint64_t kMsixBarSize = 0x1000, kMsixPbaOffset = 0x800;
  static constexpr uint64_t kBarSize = 0x4000;
  static constexpr uint64_t kCommonOffset = 0x0000, kIsrOffset = 0x1000, kDeviceOffset = 0x2000,
                            kNotifyOffset = 0x3000, kRegionSize = 0x1000;
  static constexpr uint32_t kNotifyMultiplier = 4;
  static constexpr uint16_t kVendor = 0x1af4, kNoVector = 0xffff;
  // virtio_pci_common_cfg offsets.
  static constexpr unsigned kDeviceFeatureSelect = 0x00, kDeviceFeature = 0x04, kDriverFeatureSelect = 0x08,
                            kDriverFeature = 0x0c, kMsixConfig = 0x10, kNumQueues = 0x12, kDeviceStatus = 0x14,
                            kConfigGeneration = 0x15, kQueueSelect = 0x16, kQueueSize = 0x18, kQueueMsixVector = 0x1a,
                            kQueueEnable = 0x1c, kQueueNotifyOff = 0x1e, kQueueDesc = 0x20, kQueueDriver = 0x28,
                            kQueueDevice = 0x30, kCommonSize = 0x38;
  // Capability configuration types.
  static constexpr uint8_t kCapCommon = 1, kCapNotify = 2, kCapIsr = 3, kCapDevice = 4, kCapPciCfg = 5;

  // `msi`: where MSI-X messages go (the local APIC); nullptr offers no MSI-X.
  VirtioPci(VirtioDevice& device, GuestMemory& memory, MsiSink* msi = nullptr);

  // PciFunction and Device.
  std::string_view name() const override { return device_.name(); }
  void bar_read(unsigned bar, uint64_t offset, std::span<uint8_t> data) override;
  void bar_write(unsigned bar, uint64_t offset, std::span<const uint8_t> data) override;
  // Device: the BAR's registers (offset from the BAR's base); the bus reaches them through PciHost's windows.
  void read(uint64_t offset, std::span<uint8_t> data) override { bar_read(kBar, offset, data); }
  void write(uint64_t offset, std::span<const uint8_t> data) override { bar_write(kBar, offset, data); }
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;
  std::optional<uint64_t> next_deadline_ns() const override { return device_.next_deadline_ns(); }
  void advance(uint64_t now_ns) override { device_.advance(now_ns); }

  // VirtioTransport.
  GuestMemory& memory() override { return memory_; }
  uint64_t negotiated() const override { return driver_features_; }
  bool queue_ready(unsigned q) const override;
  uint16_t available(unsigned q) override;
  std::optional<VirtqChain> pop(unsigned q) override;
  void push(unsigned q, uint16_t head, uint32_t written) override;
  void notify_used(unsigned q) override;
  void device_error(const std::string& why) override;

  uint8_t status() const { return status_; }
  uint8_t isr() const { return isr_; }
  // Why the device last entered DEVICE_NEEDS_RESET ("" if it never did), and how often.
  const std::string& last_error() const { return last_error_; }
  uint64_t error_count() const { return errors_; }
  uint8_t pci_cfg_capability() const { return pci_cfg_cap_; }
  uint8_t msix_capability() const { return msix_cap_; }
  bool msix_enabled() const;

 protected:
  void before_config_read(unsigned offset, unsigned size) override;
  void after_config_write(unsigned offset, unsigned size) override;

 private:
  uint64_t offered_features() const { return device_.device_features() | virtio::kTransportFeatures; }
  VirtqFeatures ring_features() const;
  uint64_t common_field(unsigned offset) const;
  void set_common_field(unsigned offset, uint64_t value);
  void common_read(uint64_t offset, std::span<uint8_t> data) const;
  void common_write(uint64_t offset, std::span<const uint8_t> data);
  void write_status(uint8_t value);
  void reset();
  // A notification: ISR bits, and INTx or the MSI-X vector `vector`.
  void raise(uint8_t isr_bits, uint16_t vector);
  bool msix_function_masked() const;
  void signal_vector(uint16_t vector);
  void deliver_pending_vectors();
  void msix_table_write(uint64_t offset, std::span<const uint8_t> data);
  bool pci_cfg_window(uint64_t* offset, unsigned* length) const;

  VirtioDevice& device_;
  GuestMemory& memory_;
  std::vector<Virtqueue> queues_;
  uint32_t device_feature_select_ = 0;
  uint32_t driver_feature_select_ = 0;
  uint64_t driver_features_ = 0;
  uint8_t status_ = 0;
  uint8_t config_generation_ = 0;
  uint16_t queue_select_ = 0;
  uint8_t isr_ = 0;
  uint32_t pending_notify_ = 0;  // queues notified before DRIVER_OK
  uint8_t pci_cfg_cap_ = 0;
  // MSI-X (with an MsiSink): the table, pending bits, and the vectors the driver mapped.
  MsiSink* msi_ = nullptr;
  uint8_t msix_cap_ = 0;
  std::vector<uint8_t> msix_table_;  // 16 bytes an entry
  uint64_t msix_pending_ = 0;        // at most 33 vectors
  uint16_t config_vector_ = kNoVector;
  std::vector<uint16_t> queue_vectors_;
  std::string last_error_;
  uint64_t errors_ = 0;
};

}  // namespace deja
