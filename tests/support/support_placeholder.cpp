// Placeholder so attnkit_test_support has a source until the shared test helpers land.
namespace attnkit::testing {}
