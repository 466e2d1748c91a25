// Umbrella header: everything a Backplane program uses, every public header of
// core/include/backplane (checked by the test docs.umbrella_header).
#pragma once

#include <backplane/autocast.hpp>
#include <backplane/checkpoint.hpp>
#include <backplane/device.hpp>
#include <backplane/dist.hpp>
#include <backplane/dist_launch.hpp>
#include <backplane/dist_store.hpp>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>
#include <backplane/export.hpp>
#include <backplane/functions.hpp>
#include <backplane/grad_scaler.hpp>
#include <backplane/graph.hpp>
#include <backplane/lr_scheduler.hpp>
#include <backplane/nn.hpp>
#include <backplane/nn_conv.hpp>
#include <backplane/nn_functional.hpp>
#include <backplane/nn_transformer.hpp>
#include <backplane/ops.hpp>
#include <backplane/optim.hpp>
#include <backplane/parallel.hpp>
#include <backplane/profiler.hpp>
#include <backplane/runtime.hpp>
#include <backplane/serialize.hpp>
#include <backplane/tensor.hpp>
#include <backplane/train.hpp>
