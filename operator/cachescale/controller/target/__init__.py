"""The serving target: its Deployment, HPA or ScaledObject, engine flags and the actions on them."""
