// docs/names.md, walkthrough items 1-4: list devices, name them, count GPUs, try_gpu /
// try_all_gpus, and ask whether a backend is available and why not.
#include <backplane/backplane.hpp>

#include <iostream>

int main() try {
  std::cout << "Devices:\n";
  for (bp::Device* d : bp::devices()) {
    const auto& p = d->properties();
    std::cout << "  " << d->str() << "  " << p.name << "  (" << (p.total_memory >> 20)
              << " MiB, backend " << d->backend_name() << ")\n";
  }
  std::cout << "cpu device: " << bp::device("cpu").str() << " (all cores and host memory)\n";
  std::cout << "num_devices(\"cuda\") = " << bp::num_devices("cuda") << "\n";
  for (const char* type : {"cuda", "opencl"}) {
    bp::Availability a = bp::is_available(type);
    std::cout << "is_available(\"" << type << "\") = " << (a ? "yes" : "no");
    if (!a) std::cout << " because " << a.reason;
    std::cout << "\n";
  }
  // try_gpu(i): the GPU if it exists, else the CPU; never an error.
  std::cout << "try_device(\"cuda:0\")  -> " << bp::try_device("cuda:0").str() << "\n";
  std::cout << "try_device(\"cuda:10\") -> " << bp::try_device("cuda:10").str() << "\n";
  std::cout << "all_devices(\"cuda\")   -> [";
  const char* sep = "";
  for (bp::Device* d : bp::all_devices("cuda")) {
    std::cout << sep << d->str();
    sep = ", ";
  }
  std::cout << "]\n";
  if (bp::num_devices("cuda") > 0)
    std::cout << "cuda:0 is a " << bp::device("cuda:0").properties().name << "\n";
  // A device that does not exist is an error that lists what does.
  try {
    bp::device("cuda:99");
  } catch (const bp::DeviceError& e) {
    std::cout << "device(\"cuda:99\") throws DeviceError: " << e.what() << "\n";
  }
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
