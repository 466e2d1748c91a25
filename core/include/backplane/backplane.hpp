// Umbrella header: everything a Backplane program uses.
#pragma once

#include <backplane/device.hpp>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>
#include <backplane/ops.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tensor.hpp>
