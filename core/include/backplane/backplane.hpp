// Umbrella header: everything a Backplane program uses, every public header of
// core/include/backplane (checked by the test docs.umbrella_header).
#pragma once

#include <backplane/device.hpp>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>
#include <backplane/nn.hpp>
#include <backplane/ops.hpp>
#include <backplane/runtime.hpp>
#include <backplane/serialize.hpp>
#include <backplane/tensor.hpp>
#include <backplane/train.hpp>
