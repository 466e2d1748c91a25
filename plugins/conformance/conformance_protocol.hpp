// The line protocol between bp-conformance and its child processes (Note [Child processes] in
// conformance_runner.cpp). One record per line, fields separated by tabs; fields are escaped so
// that they never contain a tab or a newline.
//
//   child -> parent, --child-discover:
//     PLUGIN  path status decision reason name device_type version major minor device_count
//   child -> parent, --child-group:
//     PLAN    index name suite device dtype      (every selected test, before any runs)
//     BEGIN   index                              (written before test `index` starts)
//     RESULT  index status seconds message       (status is PASS, FAIL, ...)
//     SETUP   message                            (the group could not start: load failure)
//     DONE                                       (every test from --start on has run)
#pragma once

#include <string>
#include <vector>

namespace bpc {

std::string escape_field(const std::string& s);
std::string unescape_field(const std::string& s);
// Joins escaped fields with tabs and appends a newline.
std::string make_record(const std::vector<std::string>& fields);
// Splits a line (without its newline) into unescaped fields.
std::vector<std::string> split_record(const std::string& line);
// Writes a whole record to fd, retrying short writes; errors are ignored (the parent is gone).
void write_record(int fd, const std::vector<std::string>& fields);

}  // namespace bpc
