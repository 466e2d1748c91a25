// The flight recorder of a process group.
//
// Note [Flight recorder]
//   Every operation a rank issues (collectives with their number, point to point, barriers)
//   enters a ring of the last BACKPLANE_DIST_FLIGHT_RECORDER operations (default 2000; 0 turns
//   it off) with its description, whether its descriptor was compared ("compared"), skipped as
//   a repeated signature ("repeat"), not checked ("off") or checked per transfer ("p2p"), and
//   its state: issued (queued, not known finished), waited on by the stream (Note [Work waits];
//   not known finished), finished, or dropped (its Work destroyed before it finished, never
//   waited on). A hang's cause is usually visible by comparing ranks' records: the
//   rank whose last entry has a smaller number, or the one op still issued everywhere. The
//   record is ProcessGroup::flight_record() (JSON) on demand; when the group fails it is
//   written to <BACKPLANE_DIST_FLIGHT_DUMP><rank>.json (atomically, never through a
//   symlink's target) and, without that variable, its last eight entries go to stderr.
#include "dist/dist_internal.hpp"
#include "serialize/serialize_internal.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>

namespace bp::dist::internal {

void FlightRecorder::set_capacity(size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  capacity_ = n;
  ring_.clear();
  ring_.shrink_to_fit();
}

void FlightRecorder::add(FlightEntry e) {
  std::lock_guard<std::mutex> l(mu_);
  if (capacity_ == 0) return;
  e.id = next_++;
  if (ring_.size() < capacity_)
    ring_.push_back(std::move(e));
  else
    ring_[e.id % capacity_] = std::move(e);
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<FlightEntry> out;
  out.reserve(ring_.size());
  if (ring_.size() < capacity_) {
    out = ring_;
  } else {
    for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % capacity_]);
  }
  return out;
}

namespace {

const char* state_name(const FlightEntry& e) {
  switch (e.mark ? e.mark->state.load() : 0) {
    case 1:
      return "finished";
    case 2:
      return "dropped";
    case 3:
      return "waited on by the stream";
    default:
      return "issued";
  }
}

}  // namespace

std::string Group::flight_json() {
  nlohmann::json j;
  j["rank"] = rank;
  j["world_size"] = size;
  j["failed"] = failed.load();
  j["failure"] = failed.load() ? current_failure().message : std::string();
  j["entries"] = nlohmann::json::array();
  const auto now = Clock::now();
  for (const FlightEntry& e : flight.entries())
    j["entries"].push_back(
        {{"id", e.id},
         {"seq", e.seq},
         {"op", e.op},
         {"description", e.description},
         {"check", e.check},
         {"state", state_name(e)},
         {"age_ms", std::chrono::duration<double, std::milli>(now - e.issued).count()}});
  return j.dump(1);
}

void Group::dump_flight(const std::string& why) {
  std::vector<FlightEntry> es = flight.entries();
  if (es.empty()) return;
  const char* prefix = std::getenv("BACKPLANE_DIST_FLIGHT_DUMP");
  if (prefix && *prefix) {
    std::string path = prefix + std::to_string(rank) + ".json";
    try {
      bp::detail::write_file_atomic(path, flight_json());
      std::fprintf(stderr, "[backplane dist rank %d] %s; flight record written to %s\n", rank,
                   why.c_str(), path.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[backplane dist rank %d] the flight record could not be written: %s\n",
                   rank, e.what());
    }
    return;
  }
  std::string text = "[backplane dist rank " + std::to_string(rank) + "] " + why +
                     "; its last operations (BACKPLANE_DIST_FLIGHT_DUMP=prefix writes them all):\n";
  const size_t first = es.size() > 8 ? es.size() - 8 : 0;
  for (size_t i = first; i < es.size(); ++i)
    text += "  " + es[i].description + " [" + state_name(es[i]) + ", check " + es[i].check + "]\n";
  std::fputs(text.c_str(), stderr);
}

}  // namespace bp::dist::internal

namespace bp::dist {

std::string ProcessGroup::flight_record() {
  return impl().g->flight_json();
}

std::string flight_record() {
  return group().flight_record();
}

}  // namespace bp::dist
