// A trace's recorded machine as a libvirt domain (`deja export-libvirt`): what it ran, in libvirt's terms, with the
// recording's own facts (CPU model, backend, inputs and their SHA-256) under <metadata>.
#pragma once

#include <string>

#include "logging/trace.pb.h"

namespace deja {

// The XML namespace of deja's <metadata> element.
inline constexpr const char* kDejaMetadataNamespace = "urn:x-deja:recording";

// A domain XML describing the machine `header` recorded (`trace_path` names the recording in the metadata). It
// validates against libvirt's domain.rng, and deja imports it again (--libvirt-xml) to the same machine options.
std::string export_domain_xml(const trace::Header& header, const std::string& trace_path);

}  // namespace deja
