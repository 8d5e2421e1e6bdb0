"""cachescale: prefix-cache-aware autoscaling for LLM inference servers on Kubernetes.

The package is layered as gather → decide → act (see README): ``api`` holds the
CacheScalingPolicy types, ``sim`` the vLLM-faithful fleet simulator, ``cli`` the
``cachescale`` command. Pure layers never import Kubernetes or Prometheus clients;
import-linter enforces that.
"""

__version__ = "0.1.0.dev0"
