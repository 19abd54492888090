// 16550 UART: register file, receive FIFO, interrupt identification and the OUT2-gated IRQ level.
#include "devices/uart16550.h"

#include "devices/state_codec.h"

namespace deja {
namespace {

// Register offsets (DLAB = 0 unless noted).
constexpr unsigned kRbrThr = 0;  // DLL with DLAB
constexpr unsigned kIer = 1;     // DLM with DLAB
constexpr unsigned kIirFcr = 2;
constexpr unsigned kLcr = 3;
constexpr unsigned kMcr = 4;
constexpr unsigned kLsr = 5;
constexpr unsigned kMsr = 6;
constexpr unsigned kScr = 7;

constexpr uint8_t kIirNone = 0x01;
constexpr uint8_t kIirModemStatus = 0x00;
constexpr uint8_t kIirThre = 0x02;
constexpr uint8_t kIirRxData = 0x04;
constexpr uint8_t kIirLineStatus = 0x06;
constexpr uint8_t kIirTimeout = 0x0c;

constexpr uint8_t kLsrDataReady = 0x01;
constexpr uint8_t kLsrOverrun = 0x02;
constexpr uint8_t kLsrThre = 0x20;
constexpr uint8_t kLsrTemt = 0x40;

constexpr uint8_t kMcrOut2 = 0x08;

// A terminal on the line asserts DCD, DSR and CTS.
constexpr uint8_t kExternalModemInputs = 0xb0;

}  // namespace

Uart16550::Uart16550(IrqLine irq, ByteSink& output) : irq_(irq), output_(output) { msr_ = modem_inputs(); }

size_t Uart16550::trigger_level() const {
  static constexpr size_t kLevels[4] = {1, 4, 8, 14};
  return kLevels[fcr_ >> 6];
}

uint8_t Uart16550::modem_inputs() const {
  if (!loopback()) return kExternalModemInputs;
  // Loopback wiring (datasheet): RTS->CTS, DTR->DSR, OUT1->RI, OUT2->DCD.
  return uint8_t(((mcr_ & 0x02) ? 0x10 : 0) | ((mcr_ & 0x01) ? 0x20 : 0) | ((mcr_ & 0x04) ? 0x40 : 0) |
                 ((mcr_ & 0x08) ? 0x80 : 0));
}

void Uart16550::set_modem_inputs(uint8_t inputs) {
  uint8_t old = msr_ & 0xf0;
  uint8_t changed = old ^ inputs;
  uint8_t deltas = 0;
  if (changed & 0x10) deltas |= 0x01;                       // DCTS
  if (changed & 0x20) deltas |= 0x02;                       // DDSR
  if ((old & 0x40) && !(inputs & 0x40)) deltas |= 0x04;     // TERI: RI trailing edge only
  if (changed & 0x80) deltas |= 0x08;                       // DDCD
  msr_ = uint8_t(inputs | (msr_ & 0x0f) | deltas);
}

uint8_t Uart16550::interrupt_id() const {
  if ((ier_ & 0x04) && lsr_errors_) return kIirLineStatus;
  if (ier_ & 0x01) {
    if (fifo_enabled()) {
      if (rx_count_ >= trigger_level()) return kIirRxData;
      if (timeout_pending_ && rx_count_ > 0) return kIirTimeout;
    } else if (rx_count_ > 0) {
      return kIirRxData;
    }
  }
  if ((ier_ & 0x02) && thre_pending_) return kIirThre;
  if ((ier_ & 0x08) && (msr_ & 0x0f)) return kIirModemStatus;
  return kIirNone;
}

void Uart16550::update_irq() {
  bool level = interrupt_id() != kIirNone && (mcr_ & kMcrOut2) && !loopback();
  if (level == irq_level_) return;
  irq_level_ = level;
  irq_.set(level);
}

void Uart16550::push_rx(uint8_t byte) {
  if (rx_count_ < rx_capacity()) {
    rx_[(rx_head_ + rx_count_) % kFifoDepth] = byte;
    ++rx_count_;
    return;
  }
  lsr_errors_ |= kLsrOverrun;
  // Without FIFOs the new character overwrites the unread one (16450 behaviour); with FIFOs
  // the character in the shift register is lost and the FIFO is kept.
  if (!fifo_enabled()) rx_[rx_head_] = byte;
}

size_t Uart16550::rx_space() const { return loopback() ? 0 : rx_capacity() - rx_count_; }

size_t Uart16550::receive(std::span<const uint8_t> bytes) {
  if (loopback() || bytes.empty()) return 0;
  size_t accepted = std::min(bytes.size(), rx_space());
  for (uint8_t byte : bytes) push_rx(byte);
  timeout_pending_ = rx_count_ > 0;
  update_irq();
  return accepted;
}

uint8_t Uart16550::read_register(unsigned reg) {
  bool dlab = lcr_ & 0x80;
  switch (reg) {
    case kRbrThr: {
      if (dlab) return dll_;
      if (rx_count_ == 0) return 0;
      uint8_t byte = rx_[rx_head_];
      rx_head_ = uint8_t((rx_head_ + 1) % kFifoDepth);
      --rx_count_;
      timeout_pending_ = rx_count_ > 0;
      return byte;
    }
    case kIer:
      return dlab ? dlm_ : ier_;
    case kIirFcr: {
      uint8_t id = interrupt_id();
      // Reading IIR while THRE is the reported source clears that source.
      if (id == kIirThre) thre_pending_ = false;
      return uint8_t(id | (fifo_enabled() ? 0xc0 : 0));
    }
    case kLcr:
      return lcr_;
    case kMcr:
      return mcr_;
    case kLsr: {
      uint8_t value = uint8_t((rx_count_ > 0 ? kLsrDataReady : 0) | lsr_errors_ | kLsrThre | kLsrTemt);
      lsr_errors_ = 0;
      return value;
    }
    case kMsr: {
      uint8_t value = msr_;
      msr_ &= 0xf0;
      return value;
    }
    case kScr:
    default:  // reg is 0-7
      return scr_;
  }
}

void Uart16550::write_register(unsigned reg, uint8_t value) {
  bool dlab = lcr_ & 0x80;
  switch (reg) {
    case kRbrThr:
      if (dlab) {
        dll_ = value;
        return;
      }
      if (loopback()) {
        push_rx(value);
        timeout_pending_ = rx_count_ > 0;
      } else {
        output_.write(std::span<const uint8_t>(&value, 1));
      }
      // Transmission is instantaneous: THR is empty again and its interrupt re-armed.
      thre_pending_ = true;
      return;
    case kIer:
      if (dlab) {
        dlm_ = value;
        return;
      }
      if (!(ier_ & 0x02) && (value & 0x02)) thre_pending_ = true;
      ier_ = value & 0x0f;
      return;
    case kIirFcr:
      if ((value ^ fcr_) & 0x01) {  // toggling FIFO enable empties the FIFOs
        rx_head_ = rx_count_ = 0;
      }
      if (!(value & 0x01)) {
        fcr_ = 0;  // the other bits are only programmed together with FCR0 = 1
        return;
      }
      if (value & 0x02) rx_head_ = rx_count_ = 0;
      fcr_ = value & 0xc9;
      timeout_pending_ = rx_count_ > 0;
      return;
    case kLcr:
      lcr_ = value;
      return;
    case kMcr:
      mcr_ = value & 0x1f;
      set_modem_inputs(modem_inputs());
      return;
    case kLsr:
    case kMsr:
      return;  // factory test / read-only
    case kScr:
    default:  // reg is 0-7
      scr_ = value;
      return;
  }
}

void Uart16550::read(uint64_t offset, std::span<uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) data[i] = read_register(unsigned((offset + i) & 7));
  update_irq();
}

void Uart16550::write(uint64_t offset, std::span<const uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) write_register(unsigned((offset + i) & 7), data[i]);
  update_irq();
}

namespace {
constexpr char kUartTag[] = "U550";
constexpr uint8_t kUartVersion = 1;
}  // namespace

std::vector<uint8_t> Uart16550::save() const {
  StateWriter w(kUartTag, kUartVersion);
  w.bytes(rx_);
  w.u8(rx_head_);
  w.u8(rx_count_);
  w.u8(ier_);
  w.u8(fcr_);
  w.u8(lcr_);
  w.u8(mcr_);
  w.u8(lsr_errors_);
  w.u8(msr_);
  w.u8(scr_);
  w.u8(dll_);
  w.u8(dlm_);
  w.boolean(thre_pending_);
  w.boolean(timeout_pending_);
  w.boolean(irq_level_);
  return w.take();
}

Result<> Uart16550::restore(std::span<const uint8_t> state) {
  StateReader r(state, kUartTag, kUartVersion);
  std::array<uint8_t, kFifoDepth> rx;
  r.bytes(rx);
  uint8_t head = r.u8(), count = r.u8(), ier = r.u8(), fcr = r.u8(), lcr = r.u8(), mcr = r.u8();
  uint8_t lsr_errors = r.u8(), msr = r.u8(), scr = r.u8(), dll = r.u8(), dlm = r.u8();
  bool thre = r.boolean(), timeout = r.boolean(), irq_level = r.boolean();
  if (r.ok()) {
    size_t capacity = (fcr & 0x01) ? kFifoDepth : 1;
    if (head >= kFifoDepth) r.invalid(fmt::format("FIFO head {} beyond the {}-byte FIFO", head, kFifoDepth));
    if (count > capacity) r.invalid(fmt::format("FIFO holds {} bytes, capacity is {}", count, capacity));
    if (ier & 0xf0) r.invalid(fmt::format("IER {:#x} sets reserved bits", ier));
    if (fcr & ~0xc9) r.invalid(fmt::format("FCR {:#x} keeps bits that are not stored", fcr));
    if (mcr & 0xe0) r.invalid(fmt::format("MCR {:#x} sets reserved bits", mcr));
    if (lsr_errors & ~kLsrOverrun) r.invalid(fmt::format("LSR errors {:#x} beyond OE", lsr_errors));
  }
  if (auto done = r.finish(); !done) return done;
  rx_ = rx;
  rx_head_ = head;
  rx_count_ = count;
  ier_ = ier;
  fcr_ = fcr;
  lcr_ = lcr;
  mcr_ = mcr;
  lsr_errors_ = lsr_errors;
  msr_ = msr;
  scr_ = scr;
  dll_ = dll;
  dlm_ = dlm;
  thre_pending_ = thre;
  timeout_pending_ = timeout;
  irq_level_ = irq_level;
  return {};
}

}  // namespace deja
