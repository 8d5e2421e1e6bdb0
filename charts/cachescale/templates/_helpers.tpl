{{/*
Names, labels and the small decisions several templates share.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "cachescale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* `<release>-<chart>` (or just the release when it already contains the chart name). */}}
{{- define "cachescale.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* `name-version` for the helm.sh/chart label. */}}
{{- define "cachescale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "cachescale.labels" -}}
helm.sh/chart: {{ include "cachescale.chart" . }}
{{ include "cachescale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cachescale
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the operator pods (never change them on upgrade). */}}
{{- define "cachescale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cachescale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "cachescale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cachescale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag (or @digest); the tag defaults to the chart's appVersion. */}}
{{- define "cachescale.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* "true" when more than one replica runs: kopf peering elects the active one. */}}
{{- define "cachescale.peered" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* The kopf peering object's name. */}}
{{- define "cachescale.peeringName" -}}
{{- default (include "cachescale.fullname" .) .Values.peering.name }}
{{- end }}

{{/*
Kopf runs cluster-wide when no namespace is given: its peering object is then a
ClusterKopfPeering, otherwise a KopfPeering in each served namespace.
*/}}
{{- define "cachescale.peeringResource" -}}
{{- if .Values.watchNamespaces }}kopfpeerings{{ else }}clusterkopfpeerings{{ end }}
{{- end }}

{{/* Fail early on combinations the schema cannot express. */}}
{{- define "cachescale.validate" -}}
{{- if and .Values.rbac.namespaced (not .Values.watchNamespaces) }}
{{- fail "rbac.namespaced=true needs watchNamespaces: the operator can only be granted Roles in namespaces it knows (set watchNamespaces, or rbac.namespaced=false for a ClusterRole)" }}
{{- end }}
{{- if ne (len .Values.watchNamespaces) (len (uniq .Values.watchNamespaces)) }}
{{- fail "watchNamespaces lists a namespace twice" }}
{{- end }}
{{- end }}
