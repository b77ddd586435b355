// HDF5 failures in words (see io/hdf5_errors.h).
#include "io/hdf5_errors.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "moe/io/hdf5.h"
#include "moe/log.h"

namespace moe::io::h5 {

namespace {

// The function name our driver (io/hdf5_driver.cpp) gives HDF5 with each error it pushes.
constexpr const char* kDriver = "moe driver";

herr_t collect(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<ErrorStack*>(data);
  if (!err || !err->desc || !*err->desc) return 0;
  std::string desc = err->desc;
  std::replace(desc.begin(), desc.end(), '\n', ' ');  // some HDF5 messages embed ctime()
  if (desc.find("checksum") != std::string::npos || desc.find("Fletcher32") != std::string::npos)
    out->checksum = true;
  if (err->func_name && std::strcmp(err->func_name, kDriver) == 0) {
    const std::string prefix = std::string(kDriver) + ": ";
    out->ours = desc.rfind(prefix, 0) == 0 ? desc.substr(prefix.size()) : desc;
  }
  if (std::find(out->causes.begin(), out->causes.end(), desc) == out->causes.end())
    out->causes.push_back(std::move(desc));
  return 0;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

}  // namespace

ErrorStack take_errors() {
  ErrorStack errors;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &errors);
  H5Eclear2(H5E_DEFAULT);
  return errors;
}

std::vector<std::string> take_error_stack() { return take_errors().causes; }

std::string cause_in_words(const ErrorStack& errors) {
  if (!errors.ours.empty()) return errors.ours;
  if (errors.checksum) return "the file is damaged: checksum mismatch";
  if (errors.causes.empty()) return "no cause given";
  return errors.causes.back();
}

std::string action_of(const char* statement) {
  static const std::pair<const char*, const char*> kActions[] = {
      {"H5Fcreate", "creating the file"},
      {"H5Fopen", "opening the file"},
      {"H5Fflush", "writing the file"},
      {"H5*close", "closing"},
      {"H5Dwrite", "writing the data"},
      {"H5Dread", "reading the data"},
      {"H5Dcreate", "creating the dataset"},
      {"H5Dopen", "opening the dataset"},
      {"H5Dset_extent", "growing the dataset"},
      {"H5Gcreate", "creating the group"},
      {"H5Gopen", "opening the group"},
      {"H5Lget_name_by_idx", "listing the group"},
      {"H5Gget_info", "listing the group"},
      {"H5Lexists", "looking up a name"},
      {"H5Acreate", "creating an attribute"},
      {"H5Awrite", "writing an attribute"},
      {"H5Aread", "reading an attribute"},
      {"H5Aopen", "opening an attribute"},
      {"H5Aexists", "looking up an attribute"},
      {"H5Adelete", "deleting an attribute"},
      {"H5A", "reading an attribute"},
      {"H5D", "reading the dataset's layout"},
      {"H5G", "reading the group"},
      {"H5L", "reading the group"},
  };
  const std::string text = statement;
  for (const auto& [call, action] : kActions)
    if (text.rfind(call, 0) == 0) return action;
  return "describing the data";  // property lists, dataspaces, types
}

std::string directory_problem(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (!fs::exists(status)) return str("directory '", dir, "' does not exist");
  if (!fs::is_directory(status)) return str("'", dir, "' is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return str("no permission to write in directory '", dir, "'");
  return {};
}

void fail(const Where& where, const char* statement, const char* source_file, int source_line) {
  const ErrorStack errors = take_errors();
  MOE_LOG_DEBUG(where.describe(), ": ", statement, " failed [", source_file, ":", source_line,
                "]: ", join(errors.causes));
  throw Error(str(where.describe(), ": ", action_of(statement), " failed: ", cause_in_words(errors),
                  " [", source_file, ":", source_line, "]"));
}

}  // namespace moe::io::h5
