// The rpm database read as SQLite's file format (https://www.sqlite.org/fileformat2.html) and rpm's
// header format (rpm's lib/header.cc, as rpmdb stores it: without the 8-byte magic). Every read is
// bounded by what was read: a corrupt or hostile file ends in Failure, caught below.
#include "rpm_database.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string_view>

namespace gpuguard::nodereport {
namespace {

constexpr std::size_t kMaxPagesRead = 20000;  // a cycle of pages in a corrupt file ends here
constexpr int kMaxDepth = 20;                 // SQLite's b-trees are a few levels deep
constexpr std::uint32_t kTagName = 1000, kTagVersion = 1001, kTagRelease = 1002, kTypeString = 6;

struct Failure {
  std::string why;
};

std::uint32_t be(std::string_view bytes, std::size_t at, int width) {
  if (at + static_cast<std::size_t>(width) > bytes.size()) throw Failure{"a field runs past the data that holds it"};
  std::uint32_t value = 0;
  for (int i = 0; i < width; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// SQLite's variable-length integer: seven bits a byte, big-endian, the ninth byte whole.
std::uint64_t varint(std::string_view bytes, std::size_t& at) {
  std::uint64_t value = 0;
  for (int i = 0; i < 9; ++i) {
    if (at >= bytes.size()) throw Failure{"a varint runs past the data that holds it"};
    const auto byte = static_cast<unsigned char>(bytes[at++]);
    if (i == 8) return (value << 8) | byte;
    value = (value << 7) | (byte & 0x7f);
    if ((byte & 0x80) == 0) return value;
  }
  return value;
}

// A table b-tree leaf cell: its row and where its payload is.
struct Cell {
  std::uint64_t rowid = 0;
  std::uint64_t size = 0;                    // of the whole payload
  std::string local;                         // the payload's bytes on the leaf page
  std::uint32_t overflow = 0;                // the first overflow page; 0: none
  mutable std::vector<std::uint32_t> chain;  // overflow pages found so far, in order
};

// A column of a record: its serial type and where its value lies in the payload.
struct Column {
  std::uint64_t type = 0;
  std::uint64_t offset = 0, length = 0;
};

class Database {
 public:
  Database(const HostFiles& host, std::string path) : host_(host), path_(std::move(path)) {
    const auto header = host_.read_range(path_, 0, 100);
    if (!header || header->size() < 100) throw Failure{"shorter than a SQLite database's header"};
    if (std::string_view(*header).substr(0, 16) != std::string_view("SQLite format 3\0", 16))
      throw Failure{"not a SQLite database"};
    page_size_ = be(*header, 16, 2);
    if (page_size_ == 1) page_size_ = 65536;
    if (page_size_ < 512 || (page_size_ & (page_size_ - 1)) != 0) throw Failure{"an invalid page size"};
    usable_ = page_size_ - static_cast<unsigned char>((*header)[20]);
    if (usable_ < 480) throw Failure{"an invalid reserved space"};
    if (const std::uint32_t encoding = be(*header, 56, 4); encoding != 1 && encoding != 0)
      throw Failure{"text that is not UTF-8"};
  }

  // Calls `row` for each row of the table whose b-tree starts at `root`, until it returns false.
  void each_row(std::uint32_t root, const std::function<bool(const Cell&)>& row) { walk(root, 0, row, nullptr); }

  std::optional<Cell> find_row(std::uint32_t root, std::uint64_t rowid) {
    std::optional<Cell> found;
    walk(
        root, 0,
        [&](const Cell& cell) {
          if (cell.rowid == rowid) found = cell;
          return !found;
        },
        &rowid);
    return found;
  }

  // `length` bytes of a payload from `offset` (fewer at its end), from the leaf page and the overflow
  // pages after it.
  std::string payload(const Cell& cell, std::uint64_t offset, std::uint64_t length) {
    if (offset >= cell.size) return {};
    length = std::min(length, cell.size - offset);
    std::string out;
    if (offset < cell.local.size()) {
      out = cell.local.substr(offset, std::min<std::uint64_t>(length, cell.local.size() - offset));
      offset += out.size();
    }
    const std::uint64_t per_page = usable_ - 4;
    while (out.size() < length) {
      const std::uint64_t index = (offset - cell.local.size()) / per_page;
      while (cell.chain.size() <= index) {
        const std::uint32_t next = cell.chain.empty() ? cell.overflow : be(page(cell.chain.back()), 0, 4);
        if (next == 0) throw Failure{"a payload's overflow pages end before it does"};
        cell.chain.push_back(next);
      }
      const std::string overflow = page(cell.chain[index]);
      const std::uint64_t at = (offset - cell.local.size()) % per_page;
      const std::uint64_t take = std::min(length - out.size(), per_page - at);
      out.append(overflow, 4 + at, take);
      offset += take;
    }
    return out;
  }

  std::vector<Column> columns(const Cell& cell) {
    const std::string start = payload(cell, 0, 9);
    std::size_t at = 0;
    const std::uint64_t header_size = varint(start, at);
    if (header_size > cell.size || header_size > 65536) throw Failure{"a record header larger than its record"};
    const std::string header = payload(cell, 0, header_size);
    std::vector<Column> columns;
    std::uint64_t offset = header_size;
    while (at < header.size()) {
      Column column;
      column.type = varint(header, at);
      if (column.type == 10 || column.type == 11) throw Failure{"a reserved serial type"};
      static constexpr std::uint64_t kIntegerWidths[] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0};
      column.length = column.type >= 12 ? (column.type - 12) / 2 : kIntegerWidths[column.type];
      column.offset = offset;
      offset += column.length;
      if (offset > cell.size) throw Failure{"a record's values run past it"};
      columns.push_back(column);
    }
    return columns;
  }

  std::string text(const Cell& cell, const Column& column) {
    if (column.type < 13 || column.type % 2 == 0) return {};
    return payload(cell, column.offset, column.length);
  }

  std::optional<std::int64_t> integer(const Cell& cell, const Column& column) {
    if (column.type == 8) return 0;
    if (column.type == 9) return 1;
    if (column.type < 1 || column.type > 6) return std::nullopt;
    const std::string bytes = payload(cell, column.offset, column.length);
    std::int64_t value = (static_cast<unsigned char>(bytes.at(0)) & 0x80) != 0 ? -1 : 0;
    for (const char byte : bytes)
      value = static_cast<std::int64_t>((static_cast<std::uint64_t>(value) << 8) | static_cast<unsigned char>(byte));
    return value;
  }

 private:
  std::string page(std::uint32_t number) {
    if (number == 0) throw Failure{"a reference to page 0"};
    if (++pages_read_ > kMaxPagesRead) throw Failure{"more pages than a lookup needs: a cycle"};
    auto bytes = host_.read_range(path_, std::uint64_t{number - 1} * page_size_, page_size_);
    if (!bytes || bytes->size() != page_size_) throw Failure{"page " + std::to_string(number) + " is past the end"};
    return std::move(*bytes);
  }

  Cell leaf_cell(const std::string& bytes, std::size_t at) {
    Cell cell;
    cell.size = varint(bytes, at);
    cell.rowid = varint(bytes, at);
    const std::uint64_t max_local = usable_ - 35;
    std::uint64_t local = cell.size;
    if (cell.size > max_local) {
      const std::uint64_t min_local = ((usable_ - 12) * 32 / 255) - 23;
      const std::uint64_t k = min_local + ((cell.size - min_local) % (usable_ - 4));
      local = k <= max_local ? k : min_local;
    }
    if (at + local > bytes.size()) throw Failure{"a cell runs past its page"};
    cell.local = bytes.substr(at, local);
    if (local < cell.size) cell.overflow = be(bytes, at + local, 4);
    return cell;
  }

  // Depth first through a table b-tree; with `rowid`, only down the branch that can hold it. Returns
  // false once `row` has asked to stop.
  bool walk(std::uint32_t number, int depth, const std::function<bool(const Cell&)>& row, const std::uint64_t* rowid) {
    if (depth > kMaxDepth) throw Failure{"a b-tree deeper than SQLite makes them"};
    const std::string bytes = page(number);
    const std::size_t header = number == 1 ? 100 : 0;
    const auto type = static_cast<unsigned char>(bytes.at(header));
    const std::uint32_t cells = be(bytes, header + 3, 2);
    if (type == 0x0d) {
      for (std::size_t i = 0; i < cells; ++i) {
        if (!row(leaf_cell(bytes, be(bytes, header + 8 + 2 * i, 2)))) return false;
      }
      return true;
    }
    if (type != 0x05) throw Failure{"page " + std::to_string(number) + " is not part of a table"};
    for (std::size_t i = 0; i < cells; ++i) {
      std::size_t at = be(bytes, header + 12 + 2 * i, 2);
      const std::uint32_t child = be(bytes, at, 4);
      at += 4;
      const std::uint64_t key = varint(bytes, at);  // the largest rowid under `child`
      if (rowid != nullptr && *rowid > key) continue;
      if (!walk(child, depth + 1, row, rowid) || rowid != nullptr) return false;
    }
    return walk(be(bytes, header + 8, 4), depth + 1, row, rowid);
  }

  const HostFiles& host_;
  std::string path_;
  std::uint32_t page_size_ = 0, usable_ = 0;
  std::size_t pages_read_ = 0;
};

// The root pages of the tables rpm keeps, from the schema table (page 1).
std::uint32_t root_of(Database& db, const std::string& table) {
  std::uint32_t root = 0;
  db.each_row(1, [&](const Cell& cell) {
    const std::vector<Column> columns = db.columns(cell);  // type, name, tbl_name, rootpage, sql
    if (columns.size() >= 4 && db.text(cell, columns[0]) == "table" && db.text(cell, columns[1]) == table) {
      root = static_cast<std::uint32_t>(db.integer(cell, columns[3]).value_or(0));
    }
    return root == 0;
  });
  if (root == 0) throw Failure{"no table " + table};
  return root;
}

// NAME, VERSION and RELEASE from a package's header, the blob `column` of `cell`.
RpmPackage read_header(Database& db, const Cell& cell, const Column& column) {
  if (column.type < 12 || column.type % 2 != 0) throw Failure{"a package that is not a blob"};
  const auto blob = [&](std::uint64_t offset, std::uint64_t length) {
    if (offset > column.length) return std::string();
    return db.payload(cell, column.offset + offset, std::min(length, column.length - offset));
  };
  const std::string counts = blob(0, 8);
  const std::uint32_t entries = be(counts, 0, 4), data_size = be(counts, 4, 4);
  const std::uint64_t data = 8 + std::uint64_t{entries} * 16;
  if (entries > 65536 || data + data_size > column.length) throw Failure{"a package header larger than its blob"};
  const std::string index = blob(8, std::uint64_t{entries} * 16);
  RpmPackage package;
  for (std::size_t i = 0; i < entries; ++i) {
    const std::uint32_t tag = be(index, i * 16, 4), type = be(index, i * 16 + 4, 4), offset = be(index, i * 16 + 8, 4);
    std::string* field = tag == kTagName      ? &package.name
                         : tag == kTagVersion ? &package.version
                         : tag == kTagRelease ? &package.release
                                              : nullptr;
    if (field == nullptr || type != kTypeString || offset >= data_size) continue;
    const std::string text = blob(data + offset, std::min<std::uint64_t>(data_size - offset, 1024));
    const std::size_t end = text.find('\0');
    if (end == std::string::npos) throw Failure{"a package's string without its end"};
    *field = text.substr(0, end);
  }
  return package;
}

}  // namespace

RpmLookup find_rpm_packages(const HostFiles& host, const std::string& path, const std::vector<std::string>& names) {
  RpmLookup lookup;
  try {
    Database db(host, path);
    const std::uint32_t packages = root_of(db, "Packages"), by_name = root_of(db, "Name");
    std::set<std::uint64_t> rows;
    db.each_row(by_name, [&](const Cell& cell) {
      const std::vector<Column> columns = db.columns(cell);  // key, hnum, idx
      if (columns.size() >= 2 && std::find(names.begin(), names.end(), db.text(cell, columns[0])) != names.end()) {
        if (const auto hnum = db.integer(cell, columns[1]); hnum && *hnum > 0) rows.insert(*hnum);
      }
      return true;
    });
    for (const std::uint64_t row : rows) {
      const auto cell = db.find_row(packages, row);
      if (!cell) throw Failure{"the Name table names package " + std::to_string(row) + ", which is not there"};
      const std::vector<Column> columns = db.columns(*cell);  // hnum (the rowid, stored as NULL), blob
      if (columns.size() < 2) throw Failure{"a package row without its header"};
      RpmPackage package = read_header(db, *cell, columns[1]);
      if (std::find(names.begin(), names.end(), package.name) != names.end()) lookup.packages.push_back(package);
    }
  } catch (const Failure& failure) {
    lookup.packages.clear();
    lookup.error = failure.why;
  }
  return lookup;
}

}  // namespace gpuguard::nodereport
