//! The status page (`Accept: text/html`): one table per service. Pure: a function of the model.
