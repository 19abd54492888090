// The libvirt C API, when deja is built with it (libvirt-dev): a domain's XML by name from a connection.
#include "libvirt/domain_import.h"

#ifdef DEJA_HAVE_LIBVIRT
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#endif

namespace deja {

#ifdef DEJA_HAVE_LIBVIRT

bool libvirt_api_available() { return true; }

Result<std::string> fetch_libvirt_domain_xml(const std::string& name, const std::string& uri) {
  // libvirt prints every error to stderr by default; deja reports the one that matters itself.
  virSetErrorFunc(nullptr, [](void*, virErrorPtr) {});
  const char* where = uri.empty() ? "libvirt's default connection" : uri.c_str();
  virConnectPtr conn = virConnectOpenReadOnly(uri.empty() ? nullptr : uri.c_str());
  if (!conn) return fail(ErrorKind::kInvalidArgument, "--connect {}: {}", where, virGetLastErrorMessage());
  virDomainPtr dom = virDomainLookupByName(conn, name.c_str());
  if (!dom) {
    Error e{ErrorKind::kInvalidArgument, fmt::format("--libvirt-domain {} on {}: {}", name, where, virGetLastErrorMessage())};
    virConnectClose(conn);
    return std::unexpected(e);
  }
  // A persistent domain's own definition (what boots next), not the live state of a running one.
  const unsigned flags = virDomainIsPersistent(dom) == 1 ? VIR_DOMAIN_XML_INACTIVE : 0;
  char* xml = virDomainGetXMLDesc(dom, flags);
  Result<std::string> out = xml ? Result<std::string>(std::string(xml))
                                : fail(ErrorKind::kHost, "--libvirt-domain {}: {}", name, virGetLastErrorMessage());
  std::free(xml);
  virDomainFree(dom);
  virConnectClose(conn);
  return out;
}

#else

bool libvirt_api_available() { return false; }

Result<std::string> fetch_libvirt_domain_xml(const std::string& name, const std::string&) {
  return fail(ErrorKind::kUnsupported,
              "--libvirt-domain {}: this deja was built without the libvirt API; install libvirt-dev (Debian) and "
              "build again (CMake finds it: -DDEJA_LIBVIRT=ON), or give the domain's XML: virsh dumpxml {} > "
              "domain.xml; deja run --libvirt-xml domain.xml",
              name, name);
}

#endif

}  // namespace deja
