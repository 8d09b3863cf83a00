FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY singleton ./singleton
COPY listeners ./listeners
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin singleton
COPY deploy/singleton.toml /etc/singleton/singleton.toml
ENV SINGLETON_CONFIG=/etc/singleton/singleton.toml \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
EXPOSE 9464
# Not root, and by number, so Kubernetes' runAsNonRoot can check it (deploy/kubernetes/).
USER 10001:10001
ENTRYPOINT ["singleton"]
CMD ["run"]
