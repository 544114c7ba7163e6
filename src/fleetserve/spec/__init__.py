"""The declarative endpoint spec: our own format and HyperPod's InferenceEndpointConfig."""

from fleetserve.spec.endpoint import Endpoint, EndpointSpec
from fleetserve.spec.errors import SpecError
from fleetserve.spec.load import LoadedSpec, load_spec, load_spec_text

__all__ = ["Endpoint", "EndpointSpec", "LoadedSpec", "SpecError", "load_spec", "load_spec_text"]
