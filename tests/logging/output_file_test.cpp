// The output-file rule: OutputPlan's conflicts by path, hard link and symbolic link; what each kind refuses; a product's
// .partial checked (removed, replaced, changed, its directory removed) before it is renamed; holes in a product.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "logging/output_file.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::TempDir;

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the plan's refusal, or "" when it passes.
std::string refusal(const OutputPlan& plan) {
  auto r = plan.check();
  if (r) return "";
  EXPECT_EQ(r.error().kind, ErrorKind::kInvalidArgument);
  return r.error().message;
}

TEST(OutputPlan, AnOutputIsNoInputByPathHardLinkOrSymbolicLink) {
  TempDir dir;
  const std::string trace = dir.file("t.trace");
  put(trace, "trace");
  ASSERT_EQ(::link(trace.c_str(), dir.file("hard").c_str()), 0);
  ASSERT_EQ(::symlink(trace.c_str(), dir.file("soft").c_str()), 0);
  for (const std::string& out : {trace, dir.file("hard"), dir.file("soft"), dir.file("./t.trace"),
                                 dir.file("sub/../t.trace")}) {
    std::filesystem::create_directories(dir.file("sub"));
    OutputPlan plan;
    plan.add_input("the trace", trace);
    plan.add_output("the serial output", out, OutputKind::kConsole);
    const std::string why = refusal(plan);
    EXPECT_NE(why.find("the serial output"), std::string::npos) << out;
    EXPECT_NE(why.find("is also the trace"), std::string::npos) << out << ": " << why;
  }
  // Two outputs that do not exist yet, spelt differently.
  OutputPlan plan;
  plan.add_output("the serial output", dir.file("new.out"), OutputKind::kConsole);
  plan.add_output("the trace", dir.file("sub/../new.out"), OutputKind::kProduct);
  EXPECT_NE(refusal(plan).find("the trace"), std::string::npos);
  // A product's .partial is its file too.
  OutputPlan partial;
  partial.add_output("the serial output", dir.file("x.partial"), OutputKind::kConsole);
  partial.add_output("the trace", dir.file("x"), OutputKind::kProduct);
  EXPECT_NE(refusal(partial).find("is also the serial output"), std::string::npos);
  EXPECT_EQ(contents(trace), "trace");
}

TEST(OutputPlan, DistinctFilesAndStreamsPass) {
  TempDir dir;
  put(dir.file("image"), "image");
  OutputPlan plan;
  plan.add_input("the guest image", dir.file("image"));
  plan.add_input("the serial input", "/dev/tty");  // a terminal read and written is a console
  plan.add_input("the serial input", "-");
  plan.add_output("the serial output", "/dev/null", OutputKind::kConsole);
  plan.add_output("a disk overlay", dir.file("overlay"), OutputKind::kInPlace);
  plan.add_output("the trace", dir.file("t.trace"), OutputKind::kProduct);
  EXPECT_EQ(refusal(plan), "");
}

TEST(OutputPlan, EachKindRefusesWhatItMustNotWrite) {
  TempDir dir;
  put(dir.file("file"), "someone's");
  ASSERT_EQ(::symlink(dir.file("file").c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::symlink("/dev/null", dir.file("null-link").c_str()), 0);
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  std::filesystem::create_directories(dir.file("dir"));
  auto check = [](const std::string& path, OutputKind kind) {
    OutputPlan plan;
    plan.add_output("the output", path, kind);
    return refusal(plan);
  };
  for (OutputKind kind : {OutputKind::kProduct, OutputKind::kInPlace}) {
    EXPECT_NE(check(dir.file("link"), kind).find("symbolic link"), std::string::npos);
    EXPECT_NE(check("/dev/null", kind).find("a device"), std::string::npos);
    EXPECT_NE(check(dir.file("fifo"), kind).find("a FIFO"), std::string::npos);
    EXPECT_NE(check(dir.file("dir"), kind).find("a directory"), std::string::npos);
    EXPECT_EQ(check(dir.file("file"), kind), "");
  }
  EXPECT_NE(check(dir.file("link"), OutputKind::kConsole).find("symbolic link to a file"), std::string::npos);
  EXPECT_NE(check(dir.file("dir"), OutputKind::kConsole).find("a directory"), std::string::npos);
  EXPECT_EQ(check(dir.file("null-link"), OutputKind::kConsole), "") << "a link to a device, as /dev/fd/N";
  EXPECT_EQ(check(dir.file("fifo"), OutputKind::kConsole), "");
  EXPECT_EQ(check("/dev/null", OutputKind::kConsole), "");
  put(dir.file("t.partial"), "an earlier prefix");
  EXPECT_NE(check(dir.file("t"), OutputKind::kProduct).find("t.partial exists"), std::string::npos);
  EXPECT_EQ(contents(dir.file("file")), "someone's");
}

TEST(OutputPlan, NumberedProductsConflictByNameAndByTheFilesThatExist) {
  TempDir dir;
  const std::string prefix = dir.file("t.trace.");
  put(prefix + "0.ckpt", "checkpoint");
  ASSERT_EQ(::link((prefix + "0.ckpt").c_str(), dir.file("alias").c_str()), 0);
  for (const std::string& out : {prefix + "0.ckpt", prefix + "17.ckpt", prefix + "3.ckpt.partial", dir.file("alias")}) {
    OutputPlan plan;
    plan.add_numbered_output("a checkpoint file", prefix, ".ckpt");
    plan.add_output("the serial output", out, OutputKind::kConsole);
    EXPECT_NE(refusal(plan).find("is also a checkpoint file"), std::string::npos) << out;
  }
  for (const std::string& out : {prefix + "x.ckpt", prefix + "1.ckpt.old", dir.file("t.trace")}) {
    OutputPlan plan;
    plan.add_numbered_output("a checkpoint file", prefix, ".ckpt");
    plan.add_output("the serial output", out, OutputKind::kConsole);
    EXPECT_EQ(refusal(plan), "") << out;
  }
}

TEST(ConsoleFile, TruncatesARegularFileAndWritesThroughALinkOnlyToAStream) {
  TempDir dir;
  put(dir.file("old"), "old contents");
  auto f = open_console_file(dir.file("old"), "serial output");
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_TRUE(f->owned);
  ::close(f->fd);
  EXPECT_EQ(contents(dir.file("old")), "");
  put(dir.file("target"), "someone's");
  ASSERT_EQ(::symlink(dir.file("target").c_str(), dir.file("link").c_str()), 0);
  auto link = open_console_file(dir.file("link"), "serial output");
  ASSERT_FALSE(link);
  EXPECT_EQ(contents(dir.file("target")), "someone's");
  ASSERT_EQ(::symlink("/dev/null", dir.file("null").c_str()), 0);
  auto null = open_console_file(dir.file("null"), "serial output");
  ASSERT_TRUE(null) << null.error().message;
  ::close(null->fd);
  auto out = open_console_file("/dev/stdout", "serial output");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->fd, 1);
  EXPECT_FALSE(out->owned);
}

// A product file with some bytes written, for the checks before its rename.
std::unique_ptr<ProductFile> started(const std::string& path) {
  auto f = ProductFile::create_replacing(path, "trace", ProductFile::Unfinished::kKeep);
  EXPECT_TRUE(f) << f.error().message;
  const std::string bytes = "deja's bytes";
  EXPECT_TRUE((*f)->write(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
  return std::move(*f);
}

TEST(ProductFile, IsRenamedOnlyWhenItsPartialIsStillTheFileItWrote) {
  TempDir dir;
  const std::string path = dir.file("t.trace");
  {
    auto f = started(path);
    EXPECT_TRUE(f->check_intact());
    ASSERT_TRUE(f->commit());
    EXPECT_EQ(contents(path), "deja's bytes");
  }
  {
    auto f = started(dir.file("replaced"));
    put(dir.file("foreign"), "foreign");
    std::filesystem::rename(dir.file("foreign"), dir.file("replaced.partial"));
    auto r = f->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("replaced by another file"), std::string::npos) << r.error().message;
    EXPECT_FALSE(std::filesystem::exists(dir.file("replaced")));
    EXPECT_EQ(contents(dir.file("replaced.partial")), "foreign");
  }
  {
    auto f = started(dir.file("removed"));
    std::filesystem::remove(dir.file("removed.partial"));
    auto r = f->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("was removed while deja wrote it"), std::string::npos) << r.error().message;
  }
  {
    auto f = started(dir.file("changed"));
    std::ofstream(dir.file("changed.partial"), std::ios::app) << "more";
    auto r = f->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("changed by another program"), std::string::npos) << r.error().message;
    EXPECT_FALSE(std::filesystem::exists(dir.file("changed")));
  }
  {
    std::filesystem::create_directories(dir.file("sub"));
    auto f = started(dir.file("sub/t.trace"));
    std::filesystem::remove_all(dir.file("sub"));
    auto r = f->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("directory " + dir.file("sub") + " was removed"), std::string::npos)
        << r.error().message;
  }
  {
    std::filesystem::create_directories(dir.file("moving"));
    auto f = started(dir.file("moving/t.trace"));
    std::filesystem::rename(dir.file("moving"), dir.file("moved"));
    auto r = f->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("was moved or replaced"), std::string::npos) << r.error().message;
    EXPECT_TRUE(std::filesystem::exists(dir.file("moved/t.trace.partial")));
  }
}

TEST(ProductFile, HolesAreZerosAndAFinalHoleSizesTheFile) {
  TempDir dir;
  auto bytes = [](std::string_view text) { return std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()); };
  {
    auto f = ProductFile::create_replacing(dir.file("dump"), "memory dump", ProductFile::Unfinished::kRemove);
    ASSERT_TRUE(f);
    ASSERT_TRUE((*f)->write(bytes("ab")));
    ASSERT_TRUE((*f)->skip(3));
    ASSERT_TRUE((*f)->write(bytes("c")));
    ASSERT_TRUE((*f)->skip(1 << 20));  // the file ends in a hole
    EXPECT_EQ((*f)->bytes_written(), 6u + (1 << 20));
    EXPECT_TRUE((*f)->check_intact());
    ASSERT_TRUE((*f)->commit());
  }
  const std::string got = contents(dir.file("dump"));
  ASSERT_EQ(got.size(), 6u + (1 << 20));
  EXPECT_EQ(got.substr(0, 6), std::string("ab\0\0\0c", 6));
  EXPECT_EQ(got.find_first_not_of('\0', 6), std::string::npos);
  {
    // What another program appends before the final hole is sized is still seen.
    auto f = ProductFile::create_replacing(dir.file("cut"), "memory dump", ProductFile::Unfinished::kRemove);
    ASSERT_TRUE(f);
    ASSERT_TRUE((*f)->write(bytes("ab")));
    ASSERT_TRUE((*f)->skip(4096));
    std::ofstream(dir.file("cut.partial"), std::ios::app) << "more";
    auto r = (*f)->commit();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("changed by another program"), std::string::npos) << r.error().message;
    EXPECT_FALSE(std::filesystem::exists(dir.file("cut")));
  }
}

TEST(ProductFile, AnUnfinishedDerivedFileRemovesOnlyItsOwnPartial) {
  TempDir dir;
  {
    auto f = ProductFile::create_replacing(dir.file("capture"), "packet capture", ProductFile::Unfinished::kRemove);
    ASSERT_TRUE(f);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("capture.partial")));
  {
    auto f = ProductFile::create_replacing(dir.file("capture"), "packet capture", ProductFile::Unfinished::kRemove);
    ASSERT_TRUE(f);
    put(dir.file("foreign"), "foreign");
    std::filesystem::rename(dir.file("foreign"), dir.file("capture.partial"));
  }
  EXPECT_EQ(contents(dir.file("capture.partial")), "foreign");
}

}  // namespace
}  // namespace deja
