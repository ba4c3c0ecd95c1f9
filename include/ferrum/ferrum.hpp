// Umbrella header: everything an engine needs.
#pragma once

#include "ferrum/backend.hpp"
#include "ferrum/buffer.hpp"
#include "ferrum/communicator.hpp"
#include "ferrum/cpu_backend.hpp"
#include "ferrum/cuda_backend.hpp"
#include "ferrum/dtype.hpp"
#include "ferrum/error.hpp"
#include "ferrum/half.hpp"
#include "ferrum/version.hpp"
