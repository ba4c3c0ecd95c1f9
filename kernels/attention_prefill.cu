// Placeholder: filled in by its owner this session.
namespace ferrum::kernels {}
