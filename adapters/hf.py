from adapters.base import Adapter, register


@register
class HfAdapter(Adapter):
    name = "hf"
