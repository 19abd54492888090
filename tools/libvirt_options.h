// run/record's libvirt options: the domain a run takes its machine from, and what its trace header says of it.
#pragma once

#include <optional>
#include <string>

#include "libvirt/domain_import.h"
#include "replay/trace_config.h"

namespace deja {

// --libvirt-xml FILE or --libvirt-domain NAME [--connect URI] (none: nullopt). Says what the domain maps to, and
// each note, on stderr.
Result<std::optional<DomainPlan>> domain_for_run(const std::string& xml_file, const std::string& domain_name,
                                                 const std::string& uri);
// The trace header's record of where the machine came from.
RecordedDomain domain_provenance(const DomainPlan& plan);

}  // namespace deja
