// `deja custody add|show`: the chain-of-custody log beside a trace (TRACE.custody), signed and hash-chained.
#include <cstdio>

#include "logging/custody.h"
#include "logging/output_file.h"
#include "logging/trace_format.h"
#include "tools/command_support.h"
#include "core/exit_status.h"
#include "core/messages.h"

namespace deja {

Subcommand add_custody_command(CLI::App& app) {
  struct Args {
    std::string trace, action, by, key, keyring;
    std::vector<std::string> keys;
  };
  auto a = std::make_shared<Args>();
  auto* custody = app.add_subcommand("custody", "chain-of-custody records beside a trace (TRACE.custody)");
  custody->require_subcommand(1);
  auto* add = custody->add_subcommand("add", "append a signed, hash-chained record: time, who, action, the trace's hash");
  add->add_option("TRACE", a->trace, "the trace")->required();
  add->add_option("--action", a->action, "what was done (\"collected from host X\", \"copied to case folder\")")
      ->required();
  add->add_option("--by", a->by, "who did it")->required();
  add->add_option("--key", a->key, "the Ed25519 private key (PEM) that signs the record")->required();
  auto* show = custody->add_subcommand("show", "list TRACE.custody's records and check each (signature, chain, the "
                                               "trace's hash)");
  show->add_option("TRACE", a->trace, "the trace")->required();
  show->add_option("--key", a->keys, "a trusted public key (repeatable); without --key or --keyring, signatures are "
                                     "checked against the keys the records name, which proves nothing about who");
  show->add_option("--keyring", a->keyring, "a directory of trusted *.pub keys, each named by its file");
  return {custody, [a, add, show] {
            if (add->parsed()) {
              // The log is read and replaced; it is neither the trace nor the key (logging/output_file.h).
              OutputPlan plan;
              plan.add_input("the trace", a->trace);
              plan.add_input("the key", a->key);
              plan.add_output("the custody log", custody_path(a->trace), OutputKind::kProduct);
              if (auto ok = plan.check(); !ok) return report_error(ok.error());
              auto key = SigningKey::load(a->key);
              if (!key) return report_error(key.error());
              auto record = add_custody_record(a->trace, a->by, a->action, *key);
              if (!record) return report_error(record.error());
              say("custody record {} added to {}: {} by {} (trace SHA-256 {})", record->sequence,
                  custody_path(a->trace), printable(record->action), printable(record->by), record->trace_sha256);
              return 0;
            }
            (void)show;
            TrustedKeys keys;
            for (const auto& k : a->keys)
              if (auto r = keys.add_key_file(k); !r) return report_error(r.error());
            if (!a->keyring.empty())
              if (auto r = keys.add_keyring(a->keyring); !r) return report_error(r.error());
            CustodyReport report = check_custody(a->trace, keys);
            if (!report.exists) {
              std::printf("%s: no custody records (no %s)\n", a->trace.c_str(), custody_path(a->trace).c_str());
              return 0;
            }
            for (const CustodyRecord& r : report.records) {
              std::printf("%s\n", fmt::format("{:>4}  {}  {}: {}  [signed by {}]{}", r.sequence, printable(r.time),
                                              printable(r.by), printable(r.action),
                                              r.signer.empty() ? "?" : r.signer,
                                              r.problem.empty() ? "" : "  <-- " + r.problem)
                                      .c_str());
            }
            if (!report.first_problem.empty()) {
              std::fprintf(stderr, "deja: %s: %s\n", custody_path(a->trace).c_str(), report.first_problem.c_str());
              return exit_status::kTraceEnded;
            }
            std::printf("%s\n", fmt::format("{} records, chained and signed{}; the trace's SHA-256 is the one recorded "
                                            "({})", report.records.size(),
                                            keys.empty() ? " (by keys no --key or --keyring vouches for)"
                                                         : " by trusted keys",
                                            report.trace_sha256)
                                    .c_str());
            return 0;
          }};
}

}  // namespace deja
