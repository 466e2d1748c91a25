#include "conformance_report.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

namespace bpc {

namespace {

// Printable ASCII only: plugin messages may carry arbitrary bytes, the files must stay valid.
std::string sanitize(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c == '\n' || c == '\r' || c == '\t')
      out += ' ';
    else if (c < 0x20 || c >= 0x7f)
      out += '?';
    else
      out += static_cast<char>(c);
  }
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : sanitize(s)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool write_file(const std::string& path, const std::string& text, std::string* error) {
  // Written beside the target and renamed, so a reader never sees half a file.
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      *error = "cannot open " + tmp + " for writing";
      return false;
    }
    f << text;
    if (!f.flush()) {
      *error = "cannot write " + tmp;
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    *error = "cannot rename " + tmp + " to " + path + ": " + ec.message();
    return false;
  }
  return true;
}

}  // namespace

std::string result_line(const Result& r) {
  std::string line = format("%-11s %s", status_name(r.status), r.name.c_str());
  if (r.status != Status::unsupported && r.status != Status::skip)
    line += format(" (%.3fs)", r.seconds);
  if (!r.message.empty()) line += ": " + sanitize(r.message);
  return line;
}

void Report::add(const Result& r, FILE* out) {
  results_.push_back(r);
  if (out) {
    std::fprintf(out, "%s\n", result_line(r).c_str());
    std::fflush(out);
  }
}

int Report::count(Status s) const {
  int n = 0;
  for (const Result& r : results_) n += r.status == s;
  return n;
}

int Report::passed() const {
  return count(Status::pass) + (verify_xfail_ ? 0 : count(Status::xpass));
}

int Report::failed() const {
  return count(Status::fail) + (verify_xfail_ ? count(Status::xpass) : 0);
}

int Report::skipped() const {
  return count(Status::skip) + count(Status::unsupported) + count(Status::xfail);
}

void Report::print_summary(FILE* out) const {
  std::fprintf(out, "\n%d PASS, %d FAIL, %d XPASS%s, %d XFAIL, %d UNSUPPORTED, %d SKIP\n",
               count(Status::pass), count(Status::fail), count(Status::xpass),
               verify_xfail_ ? " (counted as failures: --verify-xfail)" : "", count(Status::xfail),
               count(Status::unsupported), count(Status::skip));
  std::fprintf(out, "%d passed, %d failed, %d skipped\n", passed(), failed(), skipped());
  std::fflush(out);
}

bool Report::write_json(const std::string& path, std::string* error) const {
  // nlohmann's ordered_json keeps the keys in the order written; messages are sanitized
  // (plugins may return arbitrary bytes) and nlohmann does the escaping.
  using json = nlohmann::ordered_json;
  json doc;
  doc["tool"] = "bp-conformance";
  doc["summary"] = {{"passed", passed()},
                    {"failed", failed()},
                    {"skipped", skipped()},
                    {"pass", count(Status::pass)},
                    {"fail", count(Status::fail)},
                    {"skip", count(Status::skip)},
                    {"unsupported", count(Status::unsupported)},
                    {"xfail", count(Status::xfail)},
                    {"xpass", count(Status::xpass)}};
  json tests = json::array();
  for (const Result& r : results_)
    tests.push_back({{"name", sanitize(r.name)},
                     {"suite", sanitize(r.suite)},
                     {"device", sanitize(r.device)},
                     {"dtype", sanitize(r.dtype)},
                     {"status", status_json_name(r.status)},
                     {"message", sanitize(r.message)},
                     {"seconds", r.seconds}});
  doc["tests"] = std::move(tests);
  return write_file(path, doc.dump(2) + "\n", error);
}

bool Report::write_junit(const std::string& path, std::string* error) const {
  // One <testsuite> per group (suite x device), in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Result*>> groups;
  for (const Result& r : results_) {
    std::string g = r.suite + "[" + r.device + "]";
    if (!groups.count(g)) order.push_back(g);
    groups[g].push_back(&r);
  }
  double total_time = 0;
  for (const Result& r : results_) total_time += r.seconds;
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += format(
      "<testsuites name=\"bp-conformance\" tests=\"%zu\" failures=\"%d\" skipped=\"%d\" "
      "time=\"%.6f\">\n",
      results_.size(), failed(), skipped(), total_time);
  for (const std::string& g : order) {
    const auto& rs = groups[g];
    int failures = 0, skips = 0;
    double t = 0;
    for (const Result* r : rs) {
      bool fail = r->status == Status::fail || (verify_xfail_ && r->status == Status::xpass);
      bool skip = r->status == Status::skip || r->status == Status::unsupported ||
                  r->status == Status::xfail;
      failures += fail;
      skips += skip;
      t += r->seconds;
    }
    s += format(
        "  <testsuite name=\"%s\" tests=\"%zu\" failures=\"%d\" errors=\"0\" "
        "skipped=\"%d\" time=\"%.6f\">\n",
        xml_escape(g).c_str(), rs.size(), failures, skips, t);
    for (const Result* r : rs) {
      s += format("    <testcase classname=\"%s\" name=\"%s\" time=\"%.6f\"",
                  xml_escape(r->suite).c_str(), xml_escape(r->name).c_str(), r->seconds);
      std::string msg =
          std::string(status_name(r->status)) + (r->message.empty() ? "" : ": " + r->message);
      switch (r->status) {
        case Status::fail:
          s += ">\n      <failure message=\"" + xml_escape(msg) + "\">" + xml_escape(msg) +
               "</failure>\n    </testcase>\n";
          break;
        case Status::xpass:
          if (verify_xfail_) {
            s += ">\n      <failure message=\"" + xml_escape(msg) + "\">" + xml_escape(msg) +
                 "</failure>\n    </testcase>\n";
          } else {
            s += ">\n      <system-out>" + xml_escape(msg) + "</system-out>\n    </testcase>\n";
          }
          break;
        case Status::skip:
        case Status::unsupported:
        case Status::xfail:
          s += ">\n      <skipped message=\"" + xml_escape(msg) + "\"/>\n    </testcase>\n";
          break;
        case Status::pass:
          if (r->message.empty())
            s += "/>\n";
          else
            s += ">\n      <system-out>" + xml_escape(r->message) +
                 "</system-out>\n    </testcase>\n";
          break;
      }
    }
    s += "  </testsuite>\n";
  }
  s += "</testsuites>\n";
  return write_file(path, s, error);
}

}  // namespace bpc
