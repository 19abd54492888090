// libFuzzer target: any argument list through deja's command-line parser and its value parsers (sizes, progress modes,
// --disk and --net values).
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/command_support.h"
#include "vmm/disk_image.h"
#include "core/guest_memory.h"
#include "replay/progress_choice.h"
#include "vmm/user_network.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Arguments are NUL-separated; nothing is run, only parsed.
  std::vector<std::string> args{"deja"};
  std::string current;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(char(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  CLI::App app{"deja"};
  app.require_subcommand(1);
  std::vector<deja::Subcommand> table = deja::add_run_and_record_commands(app);
  table.push_back(deja::add_replay_command(app));
  table.push_back(deja::add_inspect_command(app));
  table.push_back(deja::add_verify_command(app));
  table.push_back(deja::add_selftest_command(app));
  table.push_back(deja::add_debug_command(app));
  table.push_back(deja::add_query_command(app));
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::Error&) {
  }
  // The values the subcommands parse themselves, for every argument given.
  for (const auto& a : args) {
    (void)deja::parse_size(a);
    (void)deja::parse_progress(a);
    (void)deja::parse_disk_option(a);
    (void)deja::parse_net_option(a);
    (void)deja::first_invalid_utf8(a);
  }
  return 0;
}
