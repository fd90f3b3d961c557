#pragma once
// The rpm database as rpm 4.16 and later keep it (RHEL 9, Fedora, Amazon Linux 2023): SQLite, one row
// per package in the table Packages, its header as a blob, and the table Name from package names to rows.
// Read a page at a time through HostFiles::read_range, as SQLite's file format defines it, because the
// database is tens of MB and the device plugin reads it every few seconds within a small memory limit;
// and without SQLite, which the product does not link. Pure: bytes in, packages out; a file that is not
// such a database is an error message, never a crash.
#include <string>
#include <vector>

#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::nodereport {

struct RpmPackage {
  std::string name, version, release;
};

struct RpmLookup {
  std::vector<RpmPackage> packages;  // those of the names asked for that are installed
  std::string error;                 // non-empty: the file is not a database this reads, and why
};

RpmLookup find_rpm_packages(const HostFiles& host, const std::string& path, const std::vector<std::string>& names);

}  // namespace gpuguard::nodereport
