// How deja creates the files it writes: one rule for every output (traces, captures, consoles, checkpoints, dumps).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deja {

// The rule, for every file a command writes:
//  1. It is none of the files the same command reads (trace, image, kernel, initrd, module, disk image, overlay,
//     checkpoint, serial input) and none of the other files it writes, whether named by the same path, another
//     spelling of it, a hard link or a symbolic link: existing files are compared by device and inode, files still
//     to be made by their canonical path.
//  2. What its kind (OutputKind) forbids is refused: a product or an overlay is never a symbolic link, a device, a
//     FIFO or a directory; a console is never a directory or a block device.
//  3. A product is written to PATH.partial and renamed over PATH only once complete (ProductFile), so an older
//     file at PATH survives a failure, and the .partial is checked to be the file deja wrote before it is renamed.
// A command states every input and output in one OutputPlan and check()s it before it opens any file for writing, so
// a conflict is a usage error (exit status 2) that leaves every file as it was.
//
// Adding an output (a signature, a custody record, a memory dump, an HTML page): add_output() it to the command's
// plan next to the others, as kProduct, then write it with ProductFile::create_replacing (or, for a run of
// numbered files such as checkpoints, add_numbered_output() and one ProductFile per member). A replay-based command
// puts its own outputs in ReplaySetupOptions::files; open_replay adds the trace's inputs and the serial output.
enum class OutputKind {
  kProduct,  // written whole, to PATH.partial renamed over PATH: traces, packet captures, checkpoints, dumps, pages
  kConsole,  // written as the guest produces it (--serial-out): "-", /dev/stdout and /dev/stderr are deja's own
             // outputs; a terminal, pipe, FIFO or character device is written as it is, also through a symbolic
             // link (/dev/fd/N, /dev/serial/...); a regular file is truncated, never through a symbolic link
  kInPlace,  // read and written in place, created when absent: a disk overlay (an input too)
};

class OutputPlan {
 public:
  // A file the command reads. "" (none) and "-" (standard input) are ignored; so is what is neither a regular
  // file nor absent (a terminal or FIFO read and written by the same command is a console, not a conflict).
  void add_input(std::string what, const std::string& path);
  // A file the command writes, `what` naming it in messages ("the serial output").
  void add_output(std::string what, const std::string& path, OutputKind kind);
  // The numbered products PREFIX + N + SUFFIX (N = 0, 1, ...: checkpoint files), some of which may exist and be read
  // by the same command, which replaces them. Any other file whose canonical path has that form, or that is one of
  // those existing now, conflicts with them.
  void add_numbered_output(std::string what, const std::string& prefix, const std::string& suffix);
  // Every output against every other file and against its kind; the first conflict is refused (kInvalidArgument,
  // exit status 2), naming both files. Nothing is opened for writing.
  Result<> check() const;

 private:
  struct Entry {
    std::string what;
    std::string path;
    std::optional<OutputKind> output;  // none: an input
    bool partial = false;              // the PATH.partial of a product (checked with the product)
    bool exists = false;               // compared by dev/ino when both exist
    bool comparable = true;            // absent, or a regular file (not a terminal, FIFO or device)
    dev_t dev = 0;
    ino_t ino = 0;
    std::string canonical;  // compared when neither exists, and against numbered outputs ("" for standard output)
    // A numbered output: the canonical prefix and suffix, and the members that exist now.
    std::optional<std::pair<std::string, std::string>> numbered;
    std::vector<std::pair<dev_t, ino_t>> members;
  };
  static Entry describe(std::string what, const std::string& path, std::optional<OutputKind> output);
  static bool same_file(const Entry& a, const Entry& b);
  std::vector<Entry> entries_;
};

// The descriptor a console output (OutputKind::kConsole) is written to, and whether deja owns it.
struct ConsoleFile {
  int fd = -1;
  bool owned = false;
  std::string name;  // for messages: the path, or "standard output"
};
// Opens a console output as the rule says (a regular file is truncated only after it was opened without following a
// symbolic link). `what` names it in messages ("serial output").
Result<ConsoleFile> open_console_file(const std::string& path, std::string_view what);

// A product file (OutputKind::kProduct). create_replacing() writes PATH.partial (created with O_EXCL|O_NOFOLLOW,
// mode 0600: products carry guest data) inside the directory held open, and commit() renames it over PATH after
// checking that the .partial is still the file deja created, whole (not removed, replaced, cut or appended to, its
// directory not removed or moved), and that PATH is still absent or a regular file. create_new() writes PATH itself,
// which must not exist. Destroyed without commit(), a .partial is removed (kRemove: a derived file such as a capture)
// or kept for the user (kKeep: a trace's valid prefix).
class ProductFile {
 public:
  enum class Unfinished { kRemove, kKeep };
  static Result<std::unique_ptr<ProductFile>> create_replacing(const std::string& path, std::string what,
                                                               Unfinished unfinished);
  static Result<std::unique_ptr<ProductFile>> create_new(const std::string& path, std::string what);
  ~ProductFile();
  ProductFile(const ProductFile&) = delete;
  ProductFile& operator=(const ProductFile&) = delete;

  Result<> write(std::span<const uint8_t> bytes);
  // Leaves `bytes` zero bytes as a hole (a sparse file: a memory image's unused RAM); commit() sets the size when the
  // file ends in one.
  Result<> skip(uint64_t bytes);
  Result<> sync();  // fdatasync
  Result<> set_mode(mode_t mode);  // products are made 0600; a public file (a public key) is widened here
  // Whether the file being written is still the one deja created and holds exactly what it wrote; the error says
  // what happened to it.
  Result<> check_intact() const;
  // Closes the file and (create_replacing) renames the .partial over PATH; with kNever, only when PATH is still
  // absent (a key is never replaced).
  enum class Replace { kAllow, kNever };
  Result<> commit(Replace replace = Replace::kAllow);
  // The file being written (PATH.partial until commit(), then PATH).
  const std::string& path() const { return committed_ ? final_path_ : writing_path_; }
  const std::string& final_path() const { return final_path_; }
  uint64_t bytes_written() const { return offset_; }  // skipped bytes included: the file's size once committed

 private:
  ProductFile(std::string what, std::string final_path, std::string writing_path)
      : what_(std::move(what)), final_path_(std::move(final_path)), writing_path_(std::move(writing_path)) {}
  static Result<std::unique_ptr<ProductFile>> create(const std::string& path, std::string what, bool replacing,
                                                     Unfinished unfinished);
  std::string what_;
  std::string final_path_;
  std::string writing_path_;
  std::string directory_;   // as given (for messages)
  std::string final_name_;  // within the directory
  std::string writing_name_;
  int fd_ = -1;
  int dir_fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint64_t offset_ = 0;      // the logical end: bytes written and holes skipped
  uint64_t written_end_ = 0;  // the end of the last bytes written: the file's size until a final hole is sized
  bool failed_ = false;
  bool committed_ = false;
  Unfinished unfinished_ = Unfinished::kKeep;
};

}  // namespace deja
