// The checkpoint checks of the inference expert stores (offload/checkpoint_experts.h).
#include "offload/checkpoint_experts.h"

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"

namespace moe::offload {

std::vector<DType> check_expert_tensors(const std::string& path,
                                        const std::vector<std::pair<std::string, Shape>>& tensors,
                                        const std::string& not_float) {
  (void)io::list_params(path);  // checks the format and version
  io::h5::Session session;
  io::h5::Where root{path, "/"};
  io::h5::File file = io::h5::open_file_readonly(path, "checkpoint");
  io::h5::Group group = io::h5::open_group(file, "params", root);
  std::vector<DType> dtypes;
  for (const auto& [name, shape] : tensors) {
    MOE_CHECK(io::h5::has_link(group, name, root.at("/params")), "checkpoint '", path,
              "' does not match the model: no tensor '", name, "'");
    io::h5::Where w = root.at("/params/" + name);
    io::h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
    const io::h5::DatasetInfo info = io::h5::dataset_info(dataset, w);
    MOE_CHECK(info.shape == shape, "checkpoint '", path, "' does not match the model: '", name,
              "' is ", shape_str(info.shape), ", the model's is ", shape_str(shape));
    MOE_CHECK(info.expert, "checkpoint '", path, "': '", name,
              "' is not stored as an expert tensor (one chunk per expert)");
    MOE_CHECK(is_floating(info.dtype), "checkpoint '", path, "': '", name, "' is ",
              dtype_name(info.dtype), not_float);
    dtypes.push_back(info.dtype);
  }
  return dtypes;
}

}  // namespace moe::offload
