//! `GET /metrics`: Prometheus text exposition format. Pure: a function of the model.
