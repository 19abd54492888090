// `deja inspect`: describe a trace (provenance, duration, events, serial output, Linux timeline, pcap) without a machine.
#include <cstdio>

#include "logging/trace_audit.h"
#include "logging/trace_inspect.h"
#include "logging/trace_reader.h"
#include "tools/command_support.h"
#include "tools/output_target.h"
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
    std::string html;
    std::optional<uint64_t> divergence;
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
  inspect->add_option("--html", a->html,
                      "also write the recording as one self-contained HTML page to FILE: a guest-time axis with "
                      "events, interrupts, disk, network, serial and digests, and a table with the `deja query` "
                      "command of each point (nothing fetched; written as FILE.partial, then renamed)")
      ->type_name("FILE");
  inspect->add_option("--divergence", a->divergence,
                      "with --html: mark event N, where a replay of this trace said it diverged ('replay diverged at "
                      "event N')")
      ->type_name("N");
  inspect->add_flag("--audit", a->audit, "one page for an auditor: what was recorded, where, when and by whom, what "
                                         "crossed the machine boundary, and whether everything verifies (with --json)");
  inspect->add_option("--key", a->keys, "with --audit: a trusted public key (repeatable)");
  inspect->add_option("--keyring", a->keyring, "with --audit: a directory of trusted *.pub keys");
  return {inspect, [a] {
            if (a->audit) return audit_command(a->path, a->keys, a->keyring, a->options.json);
            InspectOptions options = a->options;
            std::unique_ptr<ReplacingFile> html;
            if (a->divergence && a->html.empty())
              return report_error({ErrorKind::kInvalidArgument, "--divergence marks the --html page"});
            if (!a->html.empty()) {
              auto reader = TraceReader::open(a->path);
              if (!reader) return report_error(reader.error());
              if (!a->options.pcap.empty() && a->options.pcap == a->html)
                return report_error({ErrorKind::kInvalidArgument, "--html and --pcap name the same file"});
              std::vector<std::string> inputs{a->path};
              for (const auto& f : (*reader)->header().inputs()) inputs.push_back(f.path());
              auto file = create_output_file(a->html, "HTML timeline", inputs);
              if (!file) return report_error(file.error());
              html = std::move(*file);
              options.html = html.get();
              options.divergence_event = a->divergence;
            }
            auto r = inspect_trace(a->path, options, stdout);
            // The page of a damaged trace shows it up to the damage, as the text does.
            if (html && (r || r.error().kind == ErrorKind::kBadTrace)) {
              if (auto c = html->commit(); !c) return report_error(c.error());
            }
            if (!r) return report_error(r.error());
            return 0;
          }};
}

}  // namespace deja
