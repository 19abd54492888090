// `deja inspect`: describe a trace (provenance, duration, events, serial output, Linux timeline, pcap) without a machine.
#include <cstdio>

#include "logging/trace_audit.h"
#include "logging/trace_inspect.h"
#include "tools/command_support.h"
#include "core/exit_status.h"

namespace deja {

namespace {

int audit_command(const std::string& path, const std::vector<std::string>& keys, const std::string& keyring, bool json) {
  VerifyOptions options;
  for (const auto& k : keys)
    if (auto r = options.keys.add_key_file(k); !r) return report_error(r.error());
  if (!keyring.empty())
    if (auto r = options.keys.add_keyring(keyring); !r) return report_error(r.error());
  bool failed = false;
  if (auto r = audit_trace(path, options, json, stdout, failed); !r) return report_error(r.error());
  return failed ? exit_status::kTraceEnded : 0;
}

}  // namespace

Subcommand add_inspect_command(CLI::App& app) {
  struct Args {
    std::string path;
    InspectOptions options;
    bool audit = false;  // --audit: the auditor's page (logging/trace_audit.h)
    std::vector<std::string> keys;
    std::string keyring;
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
  inspect->add_option("--html", a->options.html,
                      "also write the recording as one self-contained HTML page to FILE: a guest-time axis with "
                      "events, interrupts, disk, network, serial and digests, and a table with the `deja query` "
                      "command of each point (nothing fetched; written as FILE.partial, then renamed)")
      ->type_name("FILE");
  inspect->add_option("--divergence", a->options.divergence_event,
                      "with --html: mark event N, where a replay of this trace said it diverged ('replay diverged at "
                      "event N')")
      ->type_name("N");
  inspect->add_flag("--audit", a->audit, "one page for an auditor: what was recorded, where, when and by whom, what "
                                         "crossed the machine boundary, and whether everything verifies (with --json)");
  inspect->add_option("--key", a->keys, "with --audit: a trusted public key (repeatable)");
  inspect->add_option("--keyring", a->keyring, "with --audit: a directory of trusted *.pub keys");
  return {inspect, [a] {
            if (a->audit) return audit_command(a->path, a->keys, a->keyring, a->options.json);
            if (a->options.divergence_event && a->options.html.empty())
              return report_error({ErrorKind::kInvalidArgument, "--divergence marks the --html page"});
            if (auto r = inspect_trace(a->path, a->options, stdout); !r) return report_error(r.error());
            return 0;
          }};
}

}  // namespace deja
