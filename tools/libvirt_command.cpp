// `deja export-libvirt`, and what run/record's --libvirt-xml and --libvirt-domain read: libvirt domains out and in.
#include <cstdio>

#include "libvirt/domain_export.h"
#include "logging/trace_reader.h"
#include "tools/command_support.h"
#include "tools/libvirt_options.h"
#include "logging/evidence_file.h"
#include "core/messages.h"

namespace deja {

Result<std::optional<DomainPlan>> domain_for_run(const std::string& xml_file, const std::string& domain_name,
                                                 const std::string& uri) {
  if (xml_file.empty() && domain_name.empty()) {
    if (!uri.empty()) return fail(ErrorKind::kInvalidArgument, "--connect names the libvirt connection of --libvirt-domain");
    return std::nullopt;
  }
  if (!xml_file.empty() && !domain_name.empty())
    return fail(ErrorKind::kInvalidArgument, "give either --libvirt-xml or --libvirt-domain");
  Result<DomainPlan> plan;
  if (!xml_file.empty()) {
    if (!uri.empty()) return fail(ErrorKind::kInvalidArgument, "--connect goes with --libvirt-domain, not a file");
    plan = import_domain_file(xml_file);
  } else {
    auto xml = fetch_libvirt_domain_xml(domain_name, uri);
    if (!xml) return std::unexpected(xml.error());
    plan = import_domain_xml(*xml, fmt::format("libvirt {}, domain {}", uri.empty() ? "(default connection)" : uri,
                                               domain_name));
  }
  if (!plan) return std::unexpected(plan.error());
  if (!plan->schema_validated)
    say("warning: {}: not checked against libvirt's schema ({} is not installed: Debian's libvirt0 ships it); deja's "
        "own checks apply", plan->source, kLibvirtDomainSchema);
  std::string devices = fmt::format("{} disk(s), {} NIC(s){}", plan->disks.size(), plan->nets.size(),
                                    plan->rng ? ", rng" : "");
  say("libvirt domain '{}'{}: {} MiB, {} vCPU, machine {}, kernel {}, {}", plan->name,
      plan->uuid.empty() ? "" : " (" + plan->uuid + ")", plan->memory_bytes >> 20, plan->vcpus, plan->machine,
      plan->kernel, devices);
  for (const auto& note : plan->notes) say("libvirt: {}", note);
  return plan;
}

RecordedDomain domain_provenance(const DomainPlan& plan) {
  return RecordedDomain{plan.name, plan.uuid, std::string(plan.xml_sha256.begin(), plan.xml_sha256.end()),
                        plan.source, plan.schema_validated};
}

Subcommand add_export_libvirt_command(CLI::App& app) {
  struct Args {
    std::string trace;
    std::string output;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("export-libvirt",
                                 "write a libvirt domain XML describing the machine a trace recorded (virsh define)");
  cmd->add_option("TRACE", a->trace, "trace file")->required();
  cmd->add_option("-o,--output", a->output, "write the XML to FILE (default: standard output)")->type_name("FILE");
  return {cmd, [a] {
            auto reader = TraceReader::open(a->trace);
            if (!reader) return report_error(reader.error());
            const std::string xml = export_domain_xml((*reader)->header(), a->trace);
            if (a->output.empty() || a->output == "-") {
              std::fwrite(xml.data(), 1, xml.size(), stdout);
              return 0;
            }
            // The one output rule (logging/output_file.h); the files the domain names are kept apart too: a domain
            // XML written over its disk image would destroy it.
            EvidenceFileRules rules{.inputs = {a->trace}};
            for (const auto& f : (*reader)->header().inputs()) rules.inputs.push_back(f.path());
            for (const auto& d : (*reader)->header().config().disks()) rules.inputs.push_back(d.path());
            if (auto r = write_evidence_file(a->output, xml, "domain XML", rules); !r) return report_error(r.error());
            return 0;
          }};
}

}  // namespace deja
