// DiskImage: the base image never written, the overlay (memory and file) and its refusals, full and lazy hashing,
// and the history that lets a replay's checkpoints move the disk back.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "vmm/disk_image.h"

namespace deja {
namespace {

namespace fs = std::filesystem;

class DiskImageTest : public ::testing::Test {
 protected:
  DiskImageTest() {
    dir = fs::temp_directory_path() / fmt::format("deja-disk-test-{}-{}", ::getpid(), counter++);
    fs::create_directories(dir);
    image = (dir / "disk.img").string();
    content.resize(300 * 1024 + 512);  // not a multiple of the 4 KiB block: the last block is short
    for (size_t i = 0; i < content.size(); ++i) content[i] = uint8_t(i * 13 + 1);
    write_file(image, content);
  }
  ~DiskImageTest() override { fs::remove_all(dir); }

  static void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  static std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<uint8_t> read(DiskImage& d, uint64_t offset, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_TRUE(d.read(offset, out));
    return out;
  }

  static inline int counter = 0;
  fs::path dir;
  std::string image;
  std::vector<uint8_t> content;
};

TEST_F(DiskImageTest, ReadsTheImageAndKeepsWritesInMemory) {
  auto d = DiskImage::open(DiskOptions{.path = image}, false);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ((*d)->size_bytes(), content.size());
  EXPECT_EQ(read(**d, 1000, 5000), std::vector<uint8_t>(content.begin() + 1000, content.begin() + 6000));
  std::vector<uint8_t> data(700, 0x5a);
  ASSERT_TRUE((*d)->write(4000, data));  // across a block boundary, partial blocks on both sides
  auto got = read(**d, 3000, 3000);
  for (size_t i = 0; i < got.size(); ++i) {
    const uint64_t at = 3000 + i;
    ASSERT_EQ(got[i], at >= 4000 && at < 4700 ? 0x5a : content[at]) << at;
  }
  ASSERT_TRUE((*d)->write_zeroes(8192, 8192 + 100));
  EXPECT_EQ(read(**d, 8192, 8292), std::vector<uint8_t>(8292, 0));
  EXPECT_EQ(read(**d, 16384 + 100, 1)[0], content[16384 + 100]);
  // The last, short block.
  ASSERT_TRUE((*d)->write(content.size() - 10, std::vector<uint8_t>(10, 7)));
  EXPECT_EQ(read(**d, content.size() - 11, 11), (std::vector<uint8_t>{content[content.size() - 11], 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}));
  std::vector<uint8_t> past(2);
  EXPECT_FALSE((*d)->read(content.size() - 1, past));
  EXPECT_FALSE((*d)->write(content.size(), past));
  EXPECT_EQ(read_file(image), content) << "the image is never written";
}

TEST_F(DiskImageTest, OverlayFileHoldsTheWritesAndIsReopened) {
  const std::string overlay = (dir / "overlay").string();
  {
    auto d = DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false);
    ASSERT_TRUE(d) << d.error().message;
    const std::string mark = "deja-overlay-mark";
    ASSERT_TRUE((*d)->write(512 * 60, std::span(reinterpret_cast<const uint8_t*>(mark.data()), mark.size())));
    ASSERT_TRUE((*d)->flush());
    auto bytes = read_file(overlay);
    EXPECT_NE(std::search(bytes.begin(), bytes.end(), mark.begin(), mark.end()), bytes.end());
    EXPECT_EQ((*d)->overlay_blocks(), 1u);
  }
  EXPECT_EQ(read_file(image), content);
  // A plain run continues from it.
  auto again = DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(read(**again, 512 * 60, 4)[0], 'd');
  // A recording must start from the image alone.
  auto recording = DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, true);
  ASSERT_FALSE(recording);
  EXPECT_NE(recording.error().message.find("earlier guest writes"), std::string::npos);
}

TEST_F(DiskImageTest, RefusesOverlaysThatAreNotOverlays) {
  const std::string other = (dir / "precious.txt").string();
  write_file(other, std::vector<uint8_t>(100, 'x'));
  auto d = DiskImage::open(DiskOptions{.path = image, .overlay = other}, false);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("not a deja overlay"), std::string::npos);
  EXPECT_EQ(read_file(other), std::vector<uint8_t>(100, 'x')) << "left untouched";
  auto self = DiskImage::open(DiskOptions{.path = image, .overlay = image}, false);
  ASSERT_FALSE(self);
  EXPECT_NE(self.error().message.find("the disk image itself"), std::string::npos);
  // An overlay of another image size.
  const std::string overlay = (dir / "overlay").string();
  ASSERT_TRUE(DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false));
  const std::string small = (dir / "small.img").string();
  write_file(small, std::vector<uint8_t>(4096, 1));
  auto mismatched = DiskImage::open(DiskOptions{.path = small, .overlay = overlay}, false);
  ASSERT_FALSE(mismatched);
  EXPECT_NE(mismatched.error().message.find("belongs to a disk image"), std::string::npos);
}

TEST_F(DiskImageTest, AnOverlayIsUsedOnlyOverTheImageItWasMadeOver) {
  const std::string overlay = (dir / "overlay").string();
  {
    auto d = DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false);
    ASSERT_TRUE(d) << d.error().message;
    ASSERT_TRUE((*d)->write(0, std::vector<uint8_t>(512, 0x77)));
  }
  const auto written = read_file(overlay);
  // Another image of the same size: refused, naming both images.
  std::vector<uint8_t> other_content = content;
  other_content[200 * 1024] ^= 1;
  const std::string other = (dir / "other.img").string();
  write_file(other, other_content);
  auto refused = DiskImage::open(DiskOptions{.path = other, .overlay = overlay}, false);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("was made over the disk image"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find(fs::absolute(image).string()), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find(other), std::string::npos) << refused.error().message;
  EXPECT_EQ(read_file(overlay), written) << "a refused overlay is left as it was";
  // A copy of the image (another file, the same bytes) is the same image; so is the image touched.
  const std::string copy = (dir / "copy.img").string();
  write_file(copy, content);
  auto accepted = DiskImage::open(DiskOptions{.path = copy, .overlay = overlay}, false);
  ASSERT_TRUE(accepted) << accepted.error().message;
  EXPECT_EQ(read(**accepted, 0, 4)[0], 0x77);
  accepted->reset();
  fs::last_write_time(image, fs::last_write_time(image) + std::chrono::hours(1));
  auto touched = DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false);
  ASSERT_TRUE(touched) << touched.error().message;
}

TEST_F(DiskImageTest, AnOverlayOfTheFirstVersionRecordsTheImageItIsUsedOver) {
  const std::string overlay = (dir / "overlay").string();
  ASSERT_TRUE(DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false));
  // What version 1 wrote: the same header without the base image's identity.
  auto bytes = read_file(overlay);
  bytes[8] = 1;
  std::fill(bytes.begin() + 48, bytes.begin() + 4096, 0);
  write_file(overlay, bytes);
  ASSERT_TRUE(DiskImage::open(DiskOptions{.path = image, .overlay = overlay}, false));
  EXPECT_EQ(read_file(overlay)[8], 2) << "adopted: it records its base now";
  std::vector<uint8_t> other_content(content.size(), 9);
  const std::string other = (dir / "other.img").string();
  write_file(other, other_content);
  EXPECT_FALSE(DiskImage::open(DiskOptions{.path = other, .overlay = overlay}, false));
}

TEST_F(DiskImageTest, ImagesInOtherFormatsAreRefusedWithTheCommandToConvertThem) {
  struct Case {
    size_t offset;
    std::string magic;
    std::string name;
    std::string qemu;
  };
  const std::vector<Case> cases = {
      {0, std::string("QFI\xfb\0\0\0\3", 8), "qcow2", "-f qcow2"},
      {0, std::string("QFI\xfb\0\0\0\1", 8), "qcow (version 1)", "-f qcow"},
      {0, std::string("QED\0", 4), "QED", "-f qed"},
      {0, "KDMV", "VMDK", "-f vmdk"},
      {0, "# Disk DescriptorFile", "VMDK", "-f vmdk"},
      {0x40, std::string("\x7f\x10\xda\xbe", 4), "VirtualBox VDI", "-f vdi"},
      {0, "vhdxfile", "VHDX", "-f vhdx"},
      {0, "conectix", "VHD (dynamic)", "-f vpc"},
      {content.size() - 512, "conectix", "VHD (fixed)", "-f vpc"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bytes = content;
    std::copy(c.magic.begin(), c.magic.end(), bytes.begin() + long(c.offset));
    const std::string path = (dir / "foreign.img").string();
    write_file(path, bytes);
    auto d = DiskImage::open(DiskOptions{.path = path}, false);
    ASSERT_FALSE(d) << c.name;
    EXPECT_NE(d.error().message.find(c.name + " image"), std::string::npos) << d.error().message;
    EXPECT_NE(d.error().message.find("qemu-img convert " + c.qemu + " -O raw " + path), std::string::npos)
        << d.error().message;
  }
  // A raw image is raw (an MBR, a filesystem), and replay reads the image as the recording did.
  EXPECT_TRUE(DiskImage::open(DiskOptions{.path = image}, false));
  DiskIdentity id{.size = content.size(), .hash_block = DiskImage::kHashBlock};
  EXPECT_TRUE(DiskImage::open_for_replay((dir / "foreign.img").string(), id, false));
}

TEST_F(DiskImageTest, RefusesBadImages) {
  EXPECT_FALSE(DiskImage::open(DiskOptions{.path = (dir / "missing").string()}, false));
  EXPECT_FALSE(DiskImage::open(DiskOptions{.path = dir.string()}, false)) << "a directory";
  const std::string tiny = (dir / "tiny").string();
  write_file(tiny, std::vector<uint8_t>(100, 0));
  EXPECT_FALSE(DiskImage::open(DiskOptions{.path = tiny}, false)) << "smaller than a sector";
}

TEST_F(DiskImageTest, ReadOnly) {
  auto d = DiskImage::open(DiskOptions{.path = image, .read_only = true}, false);
  ASSERT_TRUE(d);
  EXPECT_TRUE((*d)->read_only());
  EXPECT_FALSE((*d)->write(0, std::vector<uint8_t>(512, 0)));
}

TEST_F(DiskImageTest, FullHashIsCheckedUpFront) {
  auto d = DiskImage::open(DiskOptions{.path = image}, true);
  ASSERT_TRUE(d);
  auto id = (*d)->identity(DiskHashMode::kAuto);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->hash_block, 0u) << "small images are hashed whole";
  EXPECT_TRUE(DiskImage::open_for_replay(image, *id, false));
  auto changed = content;
  changed[123456] ^= 1;
  write_file(image, changed);
  auto refused = DiskImage::open_for_replay(image, *id, false);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("SHA-256"), std::string::npos);
  EXPECT_NE(refused.error().message.find(image), std::string::npos);
  changed.push_back(0);
  write_file(image, changed);
  refused = DiskImage::open_for_replay(image, *id, false);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("bytes here"), std::string::npos);
}

// Records every block check, or answers from a recording (what the engine does in record and replay).
class Checker : public DiskBlockChecker {
 public:
  Result<> check_disk_block(unsigned disk, uint64_t block, uint64_t hash) override {
    checks.emplace_back(block, hash);
    EXPECT_EQ(disk, 2u);
    if (expected.count(block) && expected[block] != hash) return fail(ErrorKind::kDivergence, "block {} differs", block);
    return {};
  }
  void disk_io(unsigned disk, bool write, bool zeroes, uint64_t offset, uint64_t length) override {
    EXPECT_EQ(disk, 2u);
    io.push_back(fmt::format("{} {} {}", !write ? "read" : zeroes ? "zeroes" : "write", offset, length));
  }
  std::vector<std::pair<uint64_t, uint64_t>> checks;
  std::vector<std::string> io;
  std::map<uint64_t, uint64_t> expected;
};

TEST_F(DiskImageTest, LazyHashChecksEachBlockAtItsFirstRead) {
  Checker record;
  auto d = DiskImage::open(DiskOptions{.path = image}, true);
  ASSERT_TRUE(d);
  auto id = (*d)->identity(DiskHashMode::kLazy);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->hash_block, DiskImage::kHashBlock);
  (*d)->set_block_checker(&record, 2, id->hash_block);
  read(**d, 70000, 100);     // block 1
  read(**d, 65530, 10);      // blocks 0 and 1: only 0 is new
  read(**d, 70000, 100);     // nothing new
  read(**d, 300 * 1024, 10); // the last, short block
  ASSERT_EQ(record.checks.size(), 3u);
  EXPECT_EQ(record.checks[0].first, 1u);
  EXPECT_EQ(record.checks[1].first, 0u);
  EXPECT_EQ(record.checks[2].first, 4u);
  // Replay against a changed image: the first read of the changed block fails, naming it.
  auto changed = content;
  changed[70001] ^= 0xff;
  write_file(image, changed);
  Checker replay;
  for (auto [block, hash] : record.checks) replay.expected[block] = hash;
  auto r = DiskImage::open_for_replay(image, *id, false);
  ASSERT_TRUE(r) << "lazy mode checks the size only, up front";
  (*r)->set_block_checker(&replay, 2, id->hash_block);
  std::vector<uint8_t> out(100);
  EXPECT_TRUE((*r)->read(0, out));
  EXPECT_FALSE((*r)->read(70000, out));
}

TEST_F(DiskImageTest, ReadsAndWritesAreReportedAsTheGuestMadeThem) {
  Checker checker;
  auto d = DiskImage::open(DiskOptions{.path = image}, true);
  ASSERT_TRUE(d);
  (*d)->set_block_checker(&checker, 2, 0);  // full-hash mode: no block checks, but reads and writes
  read(**d, 5000, 100);
  ASSERT_TRUE((*d)->write(4000, std::vector<uint8_t>(300, 1)));  // a partial block: its own read is not reported
  ASSERT_TRUE((*d)->write_zeroes(8192, 4096));
  EXPECT_FALSE((*d)->write(content.size(), std::vector<uint8_t>(1, 1))) << "refused: not reported";
  EXPECT_TRUE(checker.checks.empty());
  EXPECT_EQ(checker.io, (std::vector<std::string>{"read 5000 100", "write 4000 300", "zeroes 8192 4096"}));
}

TEST_F(DiskImageTest, StateFollowsWritesAndHistoryMovesBothWays) {
  auto d = DiskImage::open(DiskOptions{.path = image}, false);
  ASSERT_TRUE(d);
  (*d)->keep_history(true);
  const auto start = (*d)->save();
  ASSERT_TRUE((*d)->write(0, std::vector<uint8_t>(4096, 1)));
  const auto one = (*d)->save();
  EXPECT_NE(one, start) << "a write changes the state (digests see the disk)";
  ASSERT_TRUE((*d)->write(0, std::vector<uint8_t>(4096, 2)));
  ASSERT_TRUE((*d)->write(8192, std::vector<uint8_t>(100, 3)));
  const auto three = (*d)->save();
  ASSERT_TRUE((*d)->restore(one));
  EXPECT_EQ(read(**d, 0, 1)[0], 1);
  EXPECT_EQ(read(**d, 8192, 1)[0], content[8192]);
  EXPECT_EQ((*d)->save(), one);
  ASSERT_TRUE((*d)->restore(three)) << "a later state this replay passed (a checkpoint ahead)";
  EXPECT_EQ(read(**d, 0, 1)[0], 2);
  EXPECT_EQ(read(**d, 8192, 1)[0], 3);
  ASSERT_TRUE((*d)->restore(start));
  EXPECT_EQ(read(**d, 0, 4096), std::vector<uint8_t>(content.begin(), content.begin() + 4096));
  // Re-executing the same writes finds them; the state is the same as the first time.
  ASSERT_TRUE((*d)->write(0, std::vector<uint8_t>(4096, 1)));
  EXPECT_EQ((*d)->save(), one);
  ASSERT_TRUE((*d)->restore(three));
  // A different write after a restore drops what came after it.
  ASSERT_TRUE((*d)->restore(one));
  ASSERT_TRUE((*d)->write(0, std::vector<uint8_t>(4096, 9)));
  EXPECT_EQ(read(**d, 0, 1)[0], 9);
  EXPECT_FALSE((*d)->restore(three));
  ASSERT_TRUE((*d)->restore(one));
  EXPECT_EQ(read(**d, 0, 1)[0], 1);
  // Without history, only the present state can be restored.
  auto plain = DiskImage::open(DiskOptions{.path = image}, false);
  ASSERT_TRUE((*plain)->write(0, std::vector<uint8_t>(10, 1)));
  EXPECT_TRUE((*plain)->restore((*plain)->save()));
  EXPECT_FALSE((*plain)->restore(start));
}

TEST_F(DiskImageTest, LazyVerificationFollowsTheHistory) {
  Checker checker;
  auto d = DiskImage::open(DiskOptions{.path = image}, false);
  ASSERT_TRUE(d);
  (*d)->keep_history(true);
  (*d)->set_block_checker(&checker, 2, DiskImage::kHashBlock);
  const auto start = (*d)->save();
  read(**d, 0, 10);
  read(**d, 70000, 10);
  const auto two = (*d)->save();
  ASSERT_EQ(checker.checks.size(), 2u);
  ASSERT_TRUE((*d)->restore(start));
  read(**d, 0, 10);  // verified again: a rewound trace holds its disk_block event again
  EXPECT_EQ(checker.checks.size(), 3u);
  ASSERT_TRUE((*d)->restore(two));
  read(**d, 70000, 10);
  EXPECT_EQ(checker.checks.size(), 3u);
}

TEST(DiskOption, Parses) {
  auto o = parse_disk_option("a.img,overlay=b.ovl,hash=lazy");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->path, "a.img");
  EXPECT_EQ(o->overlay, "b.ovl");
  EXPECT_EQ(o->hash, DiskHashMode::kLazy);
  EXPECT_TRUE(parse_disk_option("a.img,readonly")->read_only);
  EXPECT_FALSE(parse_disk_option("a.img,bogus=1"));
  EXPECT_FALSE(parse_disk_option(",overlay=x"));
  EXPECT_FALSE(parse_disk_option("a.img,readonly,overlay=x"));
}

}  // namespace
}  // namespace deja
