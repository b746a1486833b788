#include "python/src/model.h"

#include <pybind11/stl.h>

#include "python/src/bindings.h"
#include "tensor/choice.h"
#include "train/inference.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

Device device_named(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  fail("device '", name, "' is not one of: cpu, cuda");
  return Device::cpu;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "A model loaded for inference (qkv.load).")
      .def_property_readonly("path", [](const Model& self) { return self.meta.path; })
      .def_property_readonly("numerics",
                             [](const Model& self) { return std::string(choice_name(kNumericsModes, self.numerics)); })
      .def_property_readonly("device", [](const Model& self) { return self.device; });
  m.def(
      "load",
      [](const std::string& path, const std::string& device, std::optional<std::string> numerics) {
        const Device dev = device_named(device);
        std::optional<Numerics> mode;
        if (numerics) {
          const Numerics* found = find_choice(kNumericsModes, *numerics);
          QKV_CHECK(found, "numerics '", *numerics, "' is not one of: ", names_or(kNumericsModes));
          mode = *found;
        }
        NumericsGuard keep_process_mode(qkv::numerics());  // the load sets the mode; the model keeps it
        train::LoadedModel loaded = train::load_for_inference(path, dev, mode);
        auto model = std::make_shared<Model>();
        model->numerics = qkv::numerics();
        model->model = std::move(loaded.model);
        model->meta = std::move(loaded.meta);
        model->device = device;
        return model;
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("numerics") = py::none(),
      "Loads a qkv checkpoint (.h5) for inference; numerics: 'standard' or 'invariant' (default: the "
      "checkpoint's train.numerics).");
}

}  // namespace qkv::python
