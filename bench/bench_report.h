// Benchmark output: the stdout table, the JSON document (what bench/plot.py reads) and CSV.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/status.h"
#include "bench/bench_ceilings.h"
#include "bench/bench_runner.h"

namespace attnkit::bench {

// Everything one `attnkit bench` invocation measured.
struct BenchRun {
  std::string command;  // the exact command line, shell-quoted
  std::string date;     // UTC, ISO 8601
  std::string device;   // "cpu" / "cuda:0"
  DeviceInfo device_info;
  int threads = 1;  // OpenMP threads of CPU backends
  std::string cases_file;
  std::string case_file_description;
  std::vector<std::string> backends;
  std::string filter;
  RunSettings settings;
  std::string rotate_why;  // how rotate_bytes was chosen
  std::vector<Ceiling> ceilings;
  std::vector<CaseResult> results;
  // /proc/loadavg when the run started and ended: other processes competing for the cores make
  // CPU timings slower and coarser (scheduler time slices).
  std::string load_start;
  std::string load_end;
};

// "attnkit-bench/1": bump when the JSON layout changes incompatibly (plot.py checks it).
inline constexpr const char* kBenchJsonSchema = "attnkit-bench/1";

// Fixed-width table: the header line and one row per result.
std::string table_header(int name_width);
std::string table_row(const CaseResult& r, int name_width);

nlohmann::ordered_json to_json(const BenchRun& run);
// One header line, then one line per result; fields with commas or quotes are quoted.
std::string to_csv(const BenchRun& run);

Status write_text_file(const std::string& path, const std::string& text);
// This process's command line from /proc/self/cmdline, each argument shell-quoted when needed.
std::string current_command_line();
std::string utc_now_iso8601();
// The first three fields of /proc/loadavg ("1.02 0.87 0.55"), empty when unavailable.
std::string host_load_average();

}  // namespace attnkit::bench
