// `deja inspect`: describe a trace (provenance, duration, events, serial output, Linux timeline, pcap) without a machine.
#include <cstdio>

#include "logging/trace_inspect.h"
#include "tools/command_support.h"

namespace deja {

Subcommand add_inspect_command(CLI::App& app) {
  struct Args {
    std::string path;
    InspectOptions options;
  };
  auto a = std::make_shared<Args>();
  auto* inspect = app.add_subcommand(
      "inspect", "describe a trace: provenance, duration, events, serial output; for Linux, a timeline; a pcap export");
  inspect->add_option("TRACE", a->path, "trace file")->required();
  inspect->add_flag("--events", a->options.events, "print the timeline of events");
  inspect->add_flag("--serial", a->options.serial, "print the recorded serial output");
  inspect->add_flag("--json", a->options.json, "machine-readable JSON");
  inspect->add_option("--pcap", a->options.pcap,
                      "also write the network frames (received and sent) to FILE as a pcap, timestamped in guest time "
                      "(replaces a regular file, as record -o does)")
      ->type_name("FILE");
  return {inspect, [a] {
            if (auto r = inspect_trace(a->path, a->options, stdout); !r) return report_error(r.error());
            return 0;
          }};
}

}  // namespace deja
