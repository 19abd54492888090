// deja's command line: a git-style subcommand table; each subcommand lives in its own tools/*_command.cpp.
#include <CLI/CLI.hpp>

#include "tools/command_support.h"
#include "core/build_info.h"
#include "core/exit_status.h"

int main(int argc, char** argv) {
  using namespace deja;
  CLI::App app{"deja: a virtual machine monitor for deterministic record and replay of x86-64 guests.\n"
               "Exit status: the guest's isa-debug-exit status ((value << 1) | 1, always odd), or deja's own:\n"
               "  2 bad arguments/image/trace, 4 guest stopped abnormally, 6 replay diverged,\n"
               "  8 trace ended early (truncated/corrupt), 10 host failure, 12 interrupted, 14 explore found a failing run."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(deja_version()) + " (" + build_id() + ")");

  std::vector<Subcommand> table = add_run_and_record_commands(app);
  table.push_back(add_replay_command(app));
  table.push_back(add_inspect_command(app));
  table.push_back(add_verify_command(app));
  table.push_back(add_selftest_command(app));
  table.push_back(add_debug_command(app));
  table.push_back(add_query_command(app));
  table.push_back(add_index_command(app));
  table.push_back(add_plan_command(app));
  table.push_back(add_segment_command(app));
  table.push_back(add_merge_command(app));
  table.push_back(add_keygen_command(app));
  table.push_back(add_sign_command(app));
  table.push_back(add_custody_command(app));
  table.push_back(add_export_libvirt_command(app));
  table.push_back(add_explore_command(app));

  remember_command_line(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : exit_status::kUsage;
  }
  for (const auto& command : table) {
    if (command.cli->parsed()) return command.run();
  }
  return exit_status::kUsage;
}
