// write_evidence_file: an audit trail's files written by the one output-file rule (logging/output_file.h).
#include "logging/evidence_file.h"

#include <sys/stat.h>

#include "logging/output_file.h"

namespace deja {

Result<> write_evidence_file(const std::string& path, std::string_view bytes, std::string_view what,
                             const EvidenceFileRules& rules) {
  const std::string name(what);
  OutputPlan plan;
  for (const std::string& input : rules.inputs) plan.add_input("an input", input);
  plan.add_output("the " + name, path, OutputKind::kProduct);
  if (auto ok = plan.check(); !ok) return ok;
  struct stat st {};
  if (!rules.replace && ::lstat(path.c_str(), &st) == 0) {
    return fail(ErrorKind::kInvalidArgument, "cannot write the {} to {}: it exists already (deja does not replace "
                "it; move or remove it)", name, path);
  }
  // A failure removes the .partial (deja made it) and leaves PATH as it was.
  auto file = ProductFile::create_replacing(path, name, ProductFile::Unfinished::kRemove);
  if (!file) return std::unexpected(file.error());
  if (auto r = (*file)->write(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())); !r) return r;
  if (rules.mode != 0600) {
    if (auto r = (*file)->set_mode(rules.mode); !r) return r;
  }
  if (auto r = (*file)->sync(); !r) return r;
  return (*file)->commit(rules.replace ? ProductFile::Replace::kAllow : ProductFile::Replace::kNever);
}

}  // namespace deja
